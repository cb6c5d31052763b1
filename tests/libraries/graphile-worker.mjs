#!/usr/bin/env node
// A workload that graphile-worker runs on its own tables, for tests/libraries.rs.
//
//   node graphile-worker.mjs --db postgres://... --schema s [--phase all|setup|run] \
//        --ok 140 --flaky 40 --doomed 20 --dups 40
//
// `--phase setup` only installs the schema (step 1), `--phase run` only runs the
// workload (steps 2-3): a watcher can be started on the empty tables in between. The
// default, `all`, does both.
//
// 1. Installs graphile-worker's schema (`_private_jobs`, the `jobs` view, its functions)
//    into `--schema` with the library's own migrations (runMigrations).
// 2. Adds ok + flaky + doomed jobs through the library's addJob (WorkerUtils), each
//    with a job key and maxAttempts = 3, all to run at one moment a few seconds ahead;
//    then adds `--dups` of the same keys again (jobKeyMode "preserve_run_at") before
//    that moment: the library folds each into the existing row (revision + 1).
// 3. Starts a worker pool (run) with one task per identifier: `ok` jobs succeed,
//    `flaky` ones throw on their first two attempts and then succeed, `doomed` ones
//    always throw, until attempts reach max_attempts (kept as permanently failed).
//    Successful jobs are DELETED by the library; failed attempts wait for its fixed
//    backoff (exp(attempts) seconds: 2.7 s, then 7.4 s).
//
// Every job stays visible to the agent for well over two of its 300 ms polls before it
// can disappear: no job runs sooner than START_AFTER_MS = 3 s after it was added, failed attempts
// wait out the library's backoff, and every successful attempt takes SUCCESS_MS = 1.2 s
// before it returns (the row is locked meanwhile: processing). The agent counts a
// success by the disappearance of a row it saw (its attempts = the failed attempts it
// saw + 1); a job that appeared and vanished between two polls would never be counted,
// so without these waits the expected counts would not be exact.
//
// When no work is left (polled in the tables) it prints ONE JSON object on stdout with
// the library's own counts (its job:success / job:error / job:failed events and the
// jobs addJob returned), and exits 0. Errors or a run over the deadline exit 1.
// Set GW_VERBOSE=1 to see the library's log on stderr.

import { EventEmitter } from 'node:events';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { Logger, makeWorkerUtils, run, runMigrations } from 'graphile-worker';

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
  },
});
if (!opt.db || !opt.schema || !/^[a-z_][a-z0-9_]*$/.test(opt.schema) || !['all', 'setup', 'run'].includes(opt.phase)) {
  console.error('usage: --db <postgres url> --schema <lower-case identifier> [--phase all|setup|run] [--ok N --flaky N --doomed N --dups N]');
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
const MAX_ATTEMPTS = 3;
const FLAKY_FAILURES = 2;
const SUCCESS_MS = 1200;
// Jobs become runnable this long after the first addJob: room for all adds and re-adds.
const START_AFTER_MS = 3000;
const TASKS = ['send_email', 'charge_card', 'sync_crm'];
const VERBOSE = !!process.env.GW_VERBOSE;

const version = (pkg) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url), 'utf8')).version;

const fail = (why) => {
  console.error(`graphile-worker workload: ${why}`);
  process.exit(1);
};

// The library logs to stdout by default: send it to stderr (or nowhere).
let libraryErrors = 0;
const logger = new Logger((scope) => (level, message) => {
  if (level === 'error') libraryErrors++;
  if (VERBOSE) console.error(`[graphile-worker ${level}] ${message}`);
});
const options = { connectionString: opt.db, schema: SCHEMA, logger };

// 1. The library's own migrations.
if (opt.phase !== 'run') await runMigrations(options);
if (opt.phase === 'setup') process.exit(0);

// 2. The jobs, through addJob.
const invocations = new Map(); // job key -> task invocations
const jobs = [];
for (let i = 0; i < TOTAL; i++) {
  const kind = i < OK ? 'ok' : i < OK + FLAKY ? 'flaky' : 'doomed';
  jobs.push({ key: `job-${i}`, task: TASKS[i % TASKS.length], payload: { n: i, kind } });
}
const spread = (all, k) => Array.from({ length: k }, (_, x) => all[Math.floor((x * all.length) / k)]);
const perTask = () => Object.fromEntries(TASKS.map((t) => [t, 0]));
const added = perTask();
const dupsFolded = perTask(); // re-adds the library folded into the existing row
const dupsNewRows = perTask(); // re-adds that made a new row (must stay 0)
const utils = await makeWorkerUtils(options);
const runAt = new Date(Date.now() + START_AFTER_MS);
const ids = new Map(); // key -> job id
try {
  for (const j of jobs) {
    const job = await utils.addJob(j.task, j.payload, {
      jobKey: j.key,
      maxAttempts: MAX_ATTEMPTS,
      runAt,
    });
    ids.set(j.key, String(job.id));
    added[j.task]++;
  }
  // Re-add keys spread over all kinds and tasks.
  for (const j of spread(jobs, DUPS)) {
    const job = await utils.addJob(j.task, j.payload, {
      jobKey: j.key,
      jobKeyMode: 'preserve_run_at',
      maxAttempts: MAX_ATTEMPTS,
      runAt,
    });
    if (String(job.id) === ids.get(j.key) && job.revision > 0) dupsFolded[j.task]++;
    else dupsNewRows[j.task]++;
  }
} finally {
  await utils.release();
}
// No worker runs before this point, so no re-add met a running job. On a loaded
// machine the adds can outlast START_AFTER_MS: the pool then starts START_AFTER_MS
// after the last add instead, so that every job still waits that long, seen by the
// agent's polls, before it can run.
const lastAdd = Date.now();
const startAt = lastAdd < runAt.getTime() ? runAt.getTime() : lastAdd + START_AFTER_MS;
await sleep(Math.max(0, startAt - Date.now()));

// 3. The worker pool and its events.
const succeeded = perTask();
const errored = perTask(); // every failed attempt (job:error)
const failed = perTask(); // permanently failed (job:failed)
// job.attempts at completion, by outcome.
const attempts = Object.fromEntries(TASKS.map((t) => [t, { succeeded: {}, failed: {} }]));
const bump = (h, a) => {
  h[a] = (h[a] ?? 0) + 1;
};
const events = new EventEmitter();
events.on('job:success', ({ job }) => {
  succeeded[job.task_identifier]++;
  bump(attempts[job.task_identifier].succeeded, job.attempts);
});
events.on('job:error', ({ job }) => {
  errored[job.task_identifier]++;
});
events.on('job:failed', ({ job }) => {
  failed[job.task_identifier]++;
  bump(attempts[job.task_identifier].failed, job.attempts);
});
const task = async (payload, helpers) => {
  const key = helpers.job.key;
  const k = (invocations.get(key) ?? 0) + 1;
  invocations.set(key, k);
  if (payload.kind === 'doomed' || (payload.kind === 'flaky' && k <= FLAKY_FAILURES)) {
    throw new Error(`${payload.kind} job ${payload.n} failed on attempt ${k}`);
  }
  await sleep(SUCCESS_MS);
};
const runner = await run({
  ...options,
  concurrency: 40,
  pollInterval: 200,
  noHandleSignals: true,
  events,
  taskList: Object.fromEntries(TASKS.map((t) => [t, task])),
});

// Settled: every job succeeded (row gone) or failed for good, and no row is locked
// or still retryable.
const pool = new pg.Pool({ connectionString: opt.db, max: 2 });
const sum = (o) => Object.values(o).reduce((a, b) => a + b, 0);
for (;;) {
  const { rows } = await pool.query(
    `SELECT count(*) AS n FROM ${SCHEMA}._private_jobs WHERE locked_at IS NOT NULL OR attempts < max_attempts`,
  );
  const open = Number(rows[0].n);
  if (open === 0 && sum(succeeded) + sum(failed) === TOTAL) break;
  if (Date.now() > DEADLINE) {
    fail(`not settled in time: ${open} open rows, ${sum(succeeded)} succeeded, ${sum(failed)} failed of ${TOTAL}`);
  }
  await sleep(100);
}
await runner.stop();
await runner.promise;
await pool.end();

const byTask = {};
for (const t of TASKS) {
  byTask[t] = {
    jobs: added[t],
    duplicates_folded: dupsFolded[t],
    duplicates_new_rows: dupsNewRows[t],
    succeeded: succeeded[t],
    failed_permanently: failed[t],
    failed_attempts: errored[t],
    invocations: jobs.filter((j) => j.task === t).reduce((a, j) => a + (invocations.get(j.key) ?? 0), 0),
    attempts: attempts[t],
  };
}
const report = {
  library: 'graphile-worker',
  version: version('graphile-worker'),
  schema: SCHEMA,
  workload: { ok: OK, flaky: FLAKY, doomed: DOOMED, dups: DUPS, max_attempts: MAX_ATTEMPTS, flaky_failures: FLAKY_FAILURES, success_ms: SUCCESS_MS },
  by_task: byTask,
  library_error_log_lines: libraryErrors, // one per failed attempt, expected
};
process.stdout.write(`${JSON.stringify(report)}\n`);
process.exit(0);
