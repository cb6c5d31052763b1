#!/usr/bin/env node
// A workload that pg-boss runs on its own tables, for tests/preset_pgboss.rs.
//
//   node pg-boss.mjs --db postgres://... --schema s [--phase all|setup|run] \
//        --ok 140 --flaky 40 --doomed 20 --dups 40
//
// `--phase setup` only installs pg-boss's schema (step 1), `--phase run` only runs the
// workload (steps 2-4): a watcher can be started on the empty tables in between. The
// default, `all`, does both.
//
// 1. Installs pg-boss's schema (`job`, partitioned by queue name, `queue`, `archive`,
//    its functions) into `--schema` with the library's own migrations: start(), stop().
// 2. Creates a dead-letter queue and the work queues with the library's createQueue,
//    each work queue with retryLimit = 2 (3 attempts), no retry delay and that
//    dead-letter queue. Sends ok + flaky + doomed jobs, two to one over the work queues,
//    through send() with ids of its own, then sends `--dups` of those ids again: the
//    library returns null for each (ON CONFLICT DO NOTHING, no row).
// 3. Works every queue with work() (10 workers each, metadata included): `ok` jobs
//    succeed, `flaky` ones throw on their first two attempts and then succeed, `doomed`
//    ones always throw;
//    after its third attempt the library marks a doomed job `failed` and copies it as a
//    new job into the dead-letter queue, whose worker completes it.
// 4. When pg-boss reports nothing queued or active in any queue, reads every job
//    back with getJobById (state, retryCount) and prints ONE JSON object on stdout with
//    the library's own counts, then exits 0. Errors or a run over the deadline exit 1.
//
// The run starts pg-boss with its maintenance and cron scheduling off, so that no job
// of its own internal queues lands in the watched table. Set PGBOSS_VERBOSE=1 to see the
// library's error events on stderr.

import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';


const { values: opt } = parseArgs({
  options: {
    db: { type: 'string' },
    schema: { type: 'string' },
    ok: { type: 'string', default: '140' },
    flaky: { type: 'string', default: '40' },
    doomed: { type: 'string', default: '20' },
    dups: { type: 'string', default: '40' },
    'deadline-ms': { type: 'string', default: '55000' },
    phase: { type: 'string', default: 'all' },
    // The npm name it is installed under: pg-boss (10.x) or pg-boss-12 (12.x, Node >= 22).
    package: { type: 'string', default: 'pg-boss' },
  },
});
if (!opt.db || !opt.schema || !/^[a-z_][a-z0-9_]*$/.test(opt.schema) || !['all', 'setup', 'run'].includes(opt.phase)
  || !['pg-boss', 'pg-boss-12'].includes(opt.package)) {
  console.error('usage: --db <postgres url> --schema <lower-case identifier> [--phase all|setup|run] [--package pg-boss|pg-boss-12] [--ok N --flaky N --doomed N --dups N]');
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
const DEADLINE = Date.now() + n('deadline-ms');
const SCHEMA = opt.schema;
const RETRY_LIMIT = 2; // retries after the first attempt: 3 attempts
const FLAKY_FAILURES = 2;
const QUEUES = ['email', 'billing'];
const DEAD = 'dead_letters';
const WORKERS = 10; // per queue
const VERBOSE = !!process.env.PGBOSS_VERBOSE;

const lib = await import(opt.package);
const PgBoss = lib.PgBoss ?? lib.default; // 12.x: a named export; 10.x: the default one
const version = (pkg) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url), 'utf8')).version;

const fail = (why) => {
  console.error(`pg-boss workload: ${why}`);
  process.exit(1);
};

let libraryErrors = 0;
const boss = (extra) => {
  const b = new PgBoss({ connectionString: opt.db, schema: SCHEMA, ...extra });
  b.on('error', (e) => {
    libraryErrors++;
    if (VERBOSE) console.error(`[pg-boss error] ${e?.message ?? e}`);
  });
  return b;
};

// 1. The library's own migrations.
if (opt.phase !== 'run') {
  const b = boss({ supervise: false, schedule: false });
  await b.start();
  await b.stop({ graceful: false, wait: true });
}
if (opt.phase === 'setup') process.exit(0);

// 2. Queues and jobs, through createQueue and send.
const b = boss({ migrate: false, supervise: false, schedule: false });
await b.start();
await b.createQueue(DEAD);
for (const q of QUEUES) {
  await b.createQueue(q, { retryLimit: RETRY_LIMIT, retryDelay: 0, retryBackoff: false, deadLetter: DEAD });
}

const jobs = [];
for (let i = 0; i < TOTAL; i++) {
  const kind = i < OK ? 'ok' : i < OK + FLAKY ? 'flaky' : 'doomed';
  jobs.push({ id: randomUUID(), queue: QUEUES[i % 3 === 0 ? 1 : 0], n: i, kind }); // 2:1, so the queues differ
}
const perQueue = (f) => Object.fromEntries([...QUEUES, DEAD].map((q) => [q, f()]));
const sent = perQueue(() => 0);
const resendNull = perQueue(() => 0); // re-sends of an existing id: send() returned null
const resendNew = perQueue(() => 0); // re-sends that made a job (must stay 0)
for (const j of jobs) {
  const id = await b.send(j.queue, { n: j.n, kind: j.kind }, { id: j.id });
  if (id !== j.id) fail(`send(${j.queue}, id ${j.id}) returned ${id}`);
  sent[j.queue]++;
}
const spread = (all, k) => Array.from({ length: k }, (_, x) => all[Math.floor((x * all.length) / k)]);
for (const j of spread(jobs, DUPS)) {
  const id = await b.send(j.queue, { n: j.n, kind: j.kind, resent: true }, { id: j.id });
  if (id === null) resendNull[j.queue]++;
  else resendNew[j.queue]++;
}

// Jobs of `queue` in one of `states` as the library reports them: getQueueSize on 10.x
// (states before `completed` / before `active`); 12.x has no getQueueSize, and its
// getQueueStats are counted by its monitor, later: there, getJobById of every job sent.
const ids = (queue) => (queue === DEAD ? deadIds : jobs.filter((j) => j.queue === queue).map((j) => j.id));
const inStates = async (queue, before) => {
  if (typeof b.getQueueSize === 'function') return b.getQueueSize(queue, { before });
  const order = ['created', 'retry', 'active', 'completed'];
  const states = order.slice(0, order.indexOf(before));
  let k = 0;
  for (const id of ids(queue)) {
    const job = await b.getJobById(queue, id);
    if (job && states.includes(job.state)) k++;
  }
  return k;
};
const open = (queue) => inStates(queue, 'completed');
const queued = (queue) => inStates(queue, 'active');

// 3. The workers. pg-boss hands a batch (here of one) to the handler; a throw fails it.
const invocations = new Map(); // job id -> handler calls
const seen = perQueue(() => ({ ok: 0, threw: 0 }));
const deadIds = [];
const handler = (queue) => async ([job]) => {
  const k = (invocations.get(job.id) ?? 0) + 1;
  invocations.set(job.id, k);
  if (job.retryCount !== k - 1) fail(`${queue} job ${job.id}: retryCount ${job.retryCount} on call ${k}`);
  const { kind, n: i } = job.data;
  // The dead-letter queue's copies carry the doomed job's data: they are handled.
  if (queue === DEAD) {
    deadIds.push(job.id);
  } else if (kind === 'doomed' || (kind === 'flaky' && k <= FLAKY_FAILURES)) {
    seen[queue].threw++;
    throw new Error(`${kind} job ${i} failed on attempt ${k}`);
  }
  seen[queue].ok++;
  return { done: i };
};
// A worker takes one batch per polling interval (at least 0.5 s): several per queue.
for (const q of [...QUEUES, DEAD]) {
  for (let w = 0; w < WORKERS; w++) {
    await b.work(q, { batchSize: 1, pollingIntervalSeconds: 0.5, includeMetadata: true }, handler(q));
  }
}

// Settled: every job through the handler as designed, and pg-boss reports nothing
// queued (created, retry) or active in any queue: complete() and fail() have landed.
const handled = () => QUEUES.reduce((a, q) => a + seen[q].ok, 0) + deadIds.length;
for (;;) {
  let unfinished = -1; // not asked until the handlers saw every job
  if (handled() === OK + FLAKY + DOOMED && seen[DEAD].ok === DOOMED) {
    unfinished = 0;
    for (const q of [...QUEUES, DEAD]) unfinished += await open(q);
    if (unfinished === 0) break;
  }
  if (Date.now() > DEADLINE) {
    fail(`not settled in time: ${unfinished} open jobs, ${handled()} handled of ${TOTAL}`);
  }
  await sleep(200);
}
for (const q of [...QUEUES, DEAD]) await b.offWork(q);

// 4. Every job as the library reports it.
const bump = (h, a) => {
  h[a] = (h[a] ?? 0) + 1;
};
const report = {};
const read = async (queue, ids) => {
  const r = {
    jobs: ids.length,
    sent: sent[queue],
    resend_null: resendNull[queue],
    resend_new_jobs: resendNew[queue],
    completed: 0,
    failed: 0,
    other_states: 0,
    handler_calls: 0,
    handler_threw: seen[queue].threw,
    // attempts (retryCount + 1) per job at completion, by final state
    attempts: { completed: {}, failed: {} },
    // retryCount as getJobById reports it, by final state
    retry_count: { completed: {}, failed: {} },
    // At the end: jobs waiting (created, retry) and not finished (also active)
    queue_size: await queued(queue),
    queue_size_before_completed: await open(queue),
  };
  for (const id of ids) {
    const job = await b.getJobById(queue, id);
    if (!job) fail(`getJobById(${queue}, ${id}) found nothing`);
    const calls = invocations.get(id) ?? 0;
    r.handler_calls += calls;
    if (job.state === 'completed' || job.state === 'failed') {
      r[job.state]++;
      bump(r.attempts[job.state], job.retryCount + 1);
      bump(r.retry_count[job.state], job.retryCount);
      if (calls !== job.retryCount + 1) fail(`${queue} job ${id}: ${calls} handler calls, retryCount ${job.retryCount}`);
    } else {
      r.other_states++;
    }
  }
  report[queue] = r;
};
for (const q of QUEUES) await read(q, jobs.filter((j) => j.queue === q).map((j) => j.id));
sent[DEAD] = 0; // the library made these, not send()
await read(DEAD, deadIds);
await b.stop({ graceful: true, wait: true });

process.stdout.write(
  `${JSON.stringify({
    library: 'pg-boss',
    version: version(opt.package),
    schema: SCHEMA,
    workload: { ok: OK, flaky: FLAKY, doomed: DOOMED, dups: DUPS, retry_limit: RETRY_LIMIT, flaky_failures: FLAKY_FAILURES, dead_letter_queue: DEAD },
    queues: report,
    library_error_events: libraryErrors,
  })}\n`,
);
process.exit(0);
