#!/usr/bin/env node
// A workload that pg-transactional-outbox runs on its own tables, for tests/libraries.rs.
//
//   node pg-transactional-outbox.mjs --db postgres://... --schema s [--phase all|setup|run] \
//        --ok 140 --flaky 40 --doomed 20 --dups 40 --redeliveries 40
//
// `--phase setup` only creates the tables (step 1), `--phase run` only runs the workload
// (steps 2-4) on tables made before: a watcher can be started on the empty tables in
// between. The default, `all`, does both.
//
// 1. Creates the library's `outbox` and `inbox` tables and its polling functions in
//    `--schema` with the library's own DatabaseSetup SQL (what its setup CLI writes).
// 2. A producer stores ok + flaky + doomed messages in the outbox through the library's
//    outbox storage (one transaction per batch), then re-stores `--dups` of them with
//    the same ids: the library swallows them (ON CONFLICT DO NOTHING, a warning).
// 3. The library's outbox polling listener "publishes" each message: its handler relays
//    it into the inbox through the library's inbox storage, in the listener's transaction.
//    Afterwards `--redeliveries` messages are delivered to the inbox again (an
//    at-least-once broker): swallowed by the inbox the same way.
// 4. The library's inbox polling listener runs one handler per message type: `ok`
//    messages succeed at once, `flaky` ones throw on their first two attempts and then
//    succeed, `doomed` ones always throw and are abandoned after maxAttempts = 3.
//
// When no work is left (polled in the tables) it prints ONE JSON object on stdout with
// what the library and the handlers saw (nothing read back from the tables), and exits 0.
// Any error or a run over the deadline exits 1 with the reason on stderr.
// Set PTO_VERBOSE=1 to see the library's own log lines on stderr.

import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import pg from 'pg';
import {
  DatabaseSetup,
  executeTransaction,
  initializeMessageStorage,
  initializePollingMessageListener,
} from 'pg-transactional-outbox';

const { values: opt } = parseArgs({
  options: {
    db: { type: 'string' },
    schema: { type: 'string' },
    ok: { type: 'string', default: '140' },
    flaky: { type: 'string', default: '40' },
    doomed: { type: 'string', default: '20' },
    dups: { type: 'string', default: '40' },
    redeliveries: { type: 'string', default: '40' },
    'deadline-ms': { type: 'string', default: '50000' },
    phase: { type: 'string', default: 'all' },
  },
});
if (!opt.db || !opt.schema || !/^[a-z_][a-z0-9_]*$/.test(opt.schema) || !['all', 'setup', 'run'].includes(opt.phase)) {
  console.error('usage: --db <postgres url> --schema <lower-case identifier> [--phase all|setup|run] [--ok N --flaky N --doomed N --dups N --redeliveries N]');
  process.exit(2);
}
const n = (k) => {
  const v = Number.parseInt(opt[k], 10);
  if (!Number.isInteger(v) || v < 0) throw new Error(`--${k} must be a count, not ${opt[k]}`);
  return v;
};
const OK = n('ok');
const FLAKY = n('flaky');
const DOOMED = n('doomed');
const TOTAL = OK + FLAKY + DOOMED;
const DUPS = Math.min(n('dups'), TOTAL);
const REDELIVERIES = Math.min(n('redeliveries'), TOTAL);
const DEADLINE = Date.now() + n('deadline-ms');
const SCHEMA = opt.schema;
const MAX_ATTEMPTS = 3;
const FLAKY_FAILURES = 2;
const AGGREGATE = 'order';
const TYPES = ['order_placed', 'payment_captured', 'shipment_booked'];
const VERBOSE = !!process.env.PTO_VERBOSE;

const version = (pkg) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url), 'utf8')).version;

// ---------------------------------------------------------------------------------
// A pino-shaped logger (the library's TransactionalLogger) that counts the library's
// "already existed" warnings: its only trace of a swallowed duplicate.
// ---------------------------------------------------------------------------------
function countingLogger(name) {
  const counts = { alreadyExisted: 0, errors: 0 };
  const out = (level) => (obj, msg, ...rest) => {
    const text = typeof obj === 'string' ? obj : msg;
    if (level === 'warn' && typeof text === 'string' && text.includes('already existed')) {
      counts.alreadyExisted++;
    }
    if (level === 'error' || level === 'fatal') counts.errors++;
    if (VERBOSE && ['fatal', 'error', 'warn', 'info'].includes(level)) {
      const detail = typeof obj === 'string' ? '' : ` ${obj?.message ?? ''}`;
      console.error(`[${name} ${level}] ${text ?? ''}${detail}`, ...rest);
    }
  };
  const logger = {
    level: 'trace',
    fatal: out('fatal'),
    error: out('error'),
    warn: out('warn'),
    info: out('info'),
    debug: out('debug'),
    trace: out('trace'),
    silent: () => {},
    child: () => logger,
  };
  return { logger, counts };
}

const fail = async (why) => {
  console.error(`pg-transactional-outbox workload: ${why}`);
  process.exit(1);
};

const pool = new pg.Pool({ connectionString: opt.db, max: 8 });
pool.on('error', (e) => console.error('pg pool error:', e.message));

// ---------------------------------------------------------------------------------
// 1. The library's own setup SQL, for both tables.
// ---------------------------------------------------------------------------------
for (const outboxOrInbox of opt.phase === 'run' ? [] : ['outbox', 'inbox']) {
  const cfg = {
    outboxOrInbox,
    database: 'test',
    schema: SCHEMA,
    table: outboxOrInbox,
    listenerRole: 'unused_role',
    nextMessagesSchema: SCHEMA,
    nextMessagesName: `next_${outboxOrInbox}_messages`,
  };
  // Roles and grants are left out: the workload connects as the database owner.
  const sql = [
    DatabaseSetup.dropAndCreateTable(cfg),
    DatabaseSetup.createPollingFunction(cfg),
    DatabaseSetup.setupPollingIndexes(cfg),
  ].join('\n');
  const client = await pool.connect();
  try {
    // Unqualified index names in setupPollingIndexes resolve in the schema itself.
    await client.query(`SET search_path TO ${SCHEMA}, public`);
    await client.query(sql);
  } finally {
    client.release();
  }
}

if (opt.phase === 'setup') {
  await pool.end();
  process.exit(0);
}

const listenerSettings = (outboxOrInbox) => ({
  dbSchema: SCHEMA,
  dbTable: outboxOrInbox,
  nextMessagesFunctionSchema: SCHEMA,
  nextMessagesFunctionName: `next_${outboxOrInbox}_messages`,
  // One message at a time. With larger batches the listener fetches the next batch
  // while handlers run, and its polling function row-locks every unprocessed row it
  // looks at (FOR NO KEY UPDATE NOWAIT), so a running handler's own NOWAIT lock fails
  // now and then: an extra failed attempt (observed: ok messages abandoned). That is
  // the library's real behaviour, but it would make the outcomes random; the counts
  // below would still be right, since they come from the library's callbacks.
  nextMessagesBatchSize: 1,
  nextMessagesPollingIntervalInMs: 100,
  // A failed message is retried once its lock has run out: the retry delay.
  nextMessagesLockInMs: 1000,
  messageProcessingTimeoutInMs: 10_000,
  // No cleanup: every row must stay for the agent (and the checks) to see.
  messageCleanupIntervalInMs: 0,
});

// ---------------------------------------------------------------------------------
// The messages: kind by index, message type round robin.
// ---------------------------------------------------------------------------------
const messages = [];
for (let i = 0; i < TOTAL; i++) {
  const kind = i < OK ? 'ok' : i < OK + FLAKY ? 'flaky' : 'doomed';
  messages.push({
    id: randomUUID(),
    aggregateType: AGGREGATE,
    aggregateId: `order-${i}`,
    messageType: TYPES[i % TYPES.length],
    segment: `order-${i}`,
    concurrency: 'parallel',
    payload: { n: i, kind },
    metadata: { producer: 'inboxwatch-test' },
  });
}
const byId = new Map(messages.map((m) => [m.id, m]));
// A fresh message object for a store: the library's stored messages carry the
// outbox's createdAt and lockedUntil, which must not be copied into the inbox.
const plain = (m) => ({
  id: m.id,
  aggregateType: m.aggregateType,
  aggregateId: m.aggregateId,
  messageType: m.messageType,
  segment: m.segment,
  concurrency: m.concurrency,
  payload: m.payload,
  metadata: m.metadata,
});

const perType = () => Object.fromEntries(TYPES.map((t) => [t, 0]));

// ---------------------------------------------------------------------------------
// 3. The outbox listener: its handler relays into the inbox.
// ---------------------------------------------------------------------------------
const outboxLog = countingLogger('outbox');
const inboxStoreLog = countingLogger('inbox-storage');
const outboxListenerLog = countingLogger('outbox-listener');
const inboxListenerLog = countingLogger('inbox-listener');

const storeOutbox = initializeMessageStorage(
  { outboxOrInbox: 'outbox', settings: { dbSchema: SCHEMA, dbTable: 'outbox' } },
  outboxLog.logger,
);
const storeInbox = initializeMessageStorage(
  { outboxOrInbox: 'inbox', settings: { dbSchema: SCHEMA, dbTable: 'inbox' } },
  inboxStoreLog.logger,
);

const published = perType(); // outbox handler runs that returned (marked processed in the same transaction)
const publishedIds = new Set();
let publishCalls = 0; // outbox handler runs that returned (more than the ids if one ran twice)
let inboxStores = 0; // calls of the inbox storage (relay + redeliveries)
const [stopOutbox] = initializePollingMessageListener(
  {
    outboxOrInbox: 'outbox',
    dbListenerConfig: { connectionString: opt.db },
    settings: {
      ...listenerSettings('outbox'),
      maxAttempts: 5,
      enableMaxAttemptsProtection: false,
      enablePoisonousMessageProtection: false,
    },
  },
  {
    handle: async (message, client) => {
      const m = byId.get(message.id);
      if (!m) throw new Error(`unknown outbox message ${message.id}`);
      inboxStores++;
      await storeInbox(plain(m), client);
      publishCalls++;
      if (!publishedIds.has(message.id)) published[message.messageType]++;
      publishedIds.add(message.id);
    },
  },
  outboxListenerLog.logger,
);

// ---------------------------------------------------------------------------------
// 4. The inbox listener: one handler per message type.
// ---------------------------------------------------------------------------------
const invocations = new Map(); // id -> handler invocations
const failures = new Map(); // id -> handleError calls
const outcome = new Map(); // id -> { result: 'succeeded'|'abandoned', attempts }
const handlers = TYPES.map((messageType) => ({
  aggregateType: AGGREGATE,
  messageType,
  handle: async (message, client) => {
    const k = (invocations.get(message.id) ?? 0) + 1;
    invocations.set(message.id, k);
    const kind = message.payload.kind;
    if (kind === 'doomed' || (kind === 'flaky' && k <= FLAKY_FAILURES)) {
      throw new Error(`${kind} message ${message.payload.n} failed on attempt ${k}`);
    }
    // The "business" write of the handler, in the library's transaction.
    await client.query('SELECT 1');
    // The library marks it processed in this transaction: finished_attempts + 1.
    outcome.set(message.id, { result: 'succeeded', attempts: message.finishedAttempts + 1 });
  },
  handleError: async (error, message, client, retry) => {
    failures.set(message.id, (failures.get(message.id) ?? 0) + 1);
    // message.finishedAttempts already counts this attempt here.
    if (!retry) outcome.set(message.id, { result: 'abandoned', attempts: message.finishedAttempts });
  },
}));
const [stopInbox] = initializePollingMessageListener(
  {
    outboxOrInbox: 'inbox',
    dbListenerConfig: { connectionString: opt.db },
    settings: {
      ...listenerSettings('inbox'),
      maxAttempts: MAX_ATTEMPTS,
      enableMaxAttemptsProtection: true,
      enablePoisonousMessageProtection: true,
    },
  },
  handlers,
  inboxListenerLog.logger,
);

// ---------------------------------------------------------------------------------
// 2. The producer: batches of 20 in one transaction each, then the re-sent ids.
// ---------------------------------------------------------------------------------
for (let i = 0; i < TOTAL; i += 20) {
  await executeTransaction(await pool.connect(), async (client) => {
    for (const m of messages.slice(i, i + 20)) await storeOutbox(plain(m), client);
  });
}
// Re-sent ids spread over all kinds and types.
const spread = (all, k) => Array.from({ length: k }, (_, x) => all[Math.floor((x * all.length) / k)]);
for (const m of spread(messages, DUPS)) {
  await executeTransaction(await pool.connect(), async (client) => storeOutbox(plain(m), client));
}

const count = async (sql) => Number((await pool.query(sql)).rows[0].n);

// Wait for every outbox message to be published, then redeliver some to the inbox.
while ((await count(`SELECT count(*) AS n FROM ${SCHEMA}.outbox WHERE processed_at IS NOT NULL`)) < TOTAL) {
  if (Date.now() > DEADLINE) await fail(`outbox not published in time (${publishedIds.size}/${TOTAL})`);
  await sleep(100);
}
for (const m of spread(messages, REDELIVERIES)) {
  inboxStores++;
  await executeTransaction(await pool.connect(), async (client) => storeInbox(plain(m), client));
}

// Wait until the inbox has nothing left to do, in the table and in the handlers.
for (;;) {
  const open = await count(
    `SELECT count(*) AS n FROM ${SCHEMA}.inbox WHERE processed_at IS NULL AND abandoned_at IS NULL`,
  );
  if (open === 0 && outcome.size === TOTAL) break;
  if (Date.now() > DEADLINE) {
    await fail(`inbox not settled in time: ${open} open rows, ${outcome.size}/${TOTAL} outcomes`);
  }
  await sleep(100);
}
await stopInbox();
await stopOutbox();
await pool.end();

// ---------------------------------------------------------------------------------
// The report: the library's and the handlers' counts.
// ---------------------------------------------------------------------------------
const inbox = {};
for (const t of TYPES) {
  // attempts: finished_attempts at completion as the library counts it, by outcome.
  inbox[t] = { messages: 0, succeeded: 0, abandoned: 0, invocations: 0, failures: 0, attempts: { succeeded: {}, abandoned: {} } };
}
for (const m of messages) {
  const row = inbox[m.messageType];
  const o = outcome.get(m.id);
  row.messages++;
  row[o.result]++;
  row.invocations += invocations.get(m.id) ?? 0;
  row.failures += failures.get(m.id) ?? 0;
  row.attempts[o.result][o.attempts] = (row.attempts[o.result][o.attempts] ?? 0) + 1;
}
const kinds = { ok: OK, flaky: FLAKY, doomed: DOOMED };
const report = {
  library: 'pg-transactional-outbox',
  version: version('pg-transactional-outbox'),
  schema: SCHEMA,
  workload: { ...kinds, max_attempts: MAX_ATTEMPTS, flaky_failures: FLAKY_FAILURES },
  outbox: {
    stored: TOTAL,
    resent: DUPS,
    duplicates_swallowed: outboxLog.counts.alreadyExisted,
    publish_calls: publishCalls,
    published,
  },
  inbox: {
    store_calls: inboxStores,
    stored: inboxStores - inboxStoreLog.counts.alreadyExisted,
    redelivered: REDELIVERIES,
    duplicates_swallowed: inboxStoreLog.counts.alreadyExisted,
    by_type: inbox,
  },
  // The inbox listener logs one error per abandoned message ("Giving up ...").
  library_error_log_lines: {
    outbox_listener: outboxListenerLog.counts.errors,
    inbox_listener: inboxListenerLog.counts.errors,
  },
};
process.stdout.write(`${JSON.stringify(report)}\n`);
process.exit(0);
