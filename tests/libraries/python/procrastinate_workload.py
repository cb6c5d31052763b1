"""A workload that procrastinate runs on its own tables, for tests/preset_python.rs.

    python procrastinate_workload.py --db postgres://... --schema s --phase setup|run \
        [--ok 140 --flaky 40 --doomed 20 --dups 40]

`--phase setup` applies procrastinate's own schema (procrastinate_jobs, the append-only
procrastinate_events log its triggers write, its functions) into `--schema`, through
the library's schema manager with `search_path` set to that schema.

`--phase run` defers ok + flaky + doomed jobs through the library's API over two tasks,
each with a queueing lock of its own, then defers `--dups` of them again with the same
queueing lock while the first is still waiting: the library refuses each
(AlreadyEnqueued). A worker of the library then runs them: `ok` jobs succeed, `flaky`
ones fail their first two attempts and then succeed, `doomed` ones always fail (the
tasks retry up to 2 times: 3 attempts). When every job has finished (asked through the
library's job manager) it prints ONE JSON object with the library's counts per task:
deferred, rejected duplicates, succeeded, failed for good, and attempts per job at
completion (the runs the task code saw, checked against the library's `attempts`).
"""

import argparse
import asyncio
import collections
import json
import logging
import re
import sys
import time

import procrastinate
from procrastinate import RetryStrategy, exceptions

TASKS = ["send_email", "charge_card"]
# Retried twice: three attempts.
RETRY = RetryStrategy(max_attempts=2)
FLAKY_FAILURES = 2


FINISHED = ("succeeded", "failed")


def status(job):
    """A job's status word (the job manager's listing gives the word, a job its enum)."""
    return getattr(job.status, "value", job.status)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--schema", required=True)
    p.add_argument("--phase", choices=["setup", "run"], required=True)
    for name, default in [("ok", 140), ("flaky", 40), ("doomed", 20), ("dups", 40)]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--deadline-s", type=float, default=60.0)
    a = p.parse_args()
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", a.schema):
        p.error("--schema must be a lower-case identifier")
    return a


def app_for(args):
    connector = procrastinate.PsycopgConnector(
        conninfo=args.db, kwargs={"options": f"-c search_path={args.schema}"}
    )
    return procrastinate.App(connector=connector)


async def setup(args):
    app = app_for(args)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def run(args):
    app = app_for(args)
    # The runs each job's task code saw, by job key.
    runs = collections.Counter()
    plan = {}

    def make(task):
        @app.task(name=task, retry=RETRY, pass_context=True)
        async def handler(context, key, kind):
            runs[key] += 1
            if kind == "doomed" or (kind == "flaky" and context.job.attempts < FLAKY_FAILURES):
                raise RuntimeError(f"{kind} job {key} fails (attempt {context.job.attempts + 1})")

        return handler

    handlers = {t: make(t) for t in TASKS}
    kinds = ["ok"] * args.ok + ["flaky"] * args.flaky + ["doomed"] * args.doomed
    deferred = collections.Counter()
    rejected = collections.Counter()
    async with app.open_async():
        for i, kind in enumerate(kinds):
            task = TASKS[i % len(TASKS)]
            key = f"{kind}-{i}"
            plan[key] = (task, kind)
            await handlers[task].configure(queueing_lock=key).defer_async(key=key, kind=kind)
            deferred[task] += 1
        # Re-sends of existing keys while their first job still waits: refused.
        for i in range(min(args.dups, len(kinds))):
            key = f"{kinds[i]}-{i}"
            task, kind = plan[key]
            try:
                await handlers[task].configure(queueing_lock=key).defer_async(key=key, kind=kind)
                deferred[task] += 1
            except exceptions.AlreadyEnqueued:
                rejected[task] += 1

        worker = asyncio.create_task(
            app.run_worker_async(concurrency=4, wait=True, install_signal_handlers=False)
        )
        deadline = time.monotonic() + args.deadline_s
        while True:
            found = await app.job_manager.list_jobs_async()
            if len(found) == len(kinds) and all(status(j) in FINISHED for j in found):
                break
            if time.monotonic() > deadline:
                print(f"deadline passed; jobs: {collections.Counter(map(status, found))}", file=sys.stderr)
                sys.exit(1)
            await asyncio.sleep(0.2)
        worker.cancel()
        try:
            await worker
        except asyncio.CancelledError:
            pass

    by_task = {
        t: {
            "deferred": deferred[t],
            "rejected_duplicates": rejected[t],
            "succeeded": 0,
            "failed": 0,
            "attempts": {"succeeded": {}, "failed": {}},
            "library_attempts": {"succeeded": {}, "failed": {}},
        }
        for t in TASKS
    }
    for j in found:
        t = by_task[j.task_name]
        outcome = status(j)
        t[outcome] += 1
        n = str(runs[j.queueing_lock])
        t["attempts"][outcome][n] = t["attempts"][outcome].get(n, 0) + 1
        # procrastinate's attempts: the retries (the runs less one).
        a = str(j.attempts)
        t["library_attempts"][outcome][a] = t["library_attempts"][outcome].get(a, 0) + 1
    print(json.dumps({"library": "procrastinate", "version": procrastinate.__version__, "by_task": by_task}))


def main():
    args = parse()
    # The failures are the workload's design: the worker's error log would only drown
    # a real problem.
    logging.basicConfig(level=logging.CRITICAL)
    asyncio.run(setup(args) if args.phase == "setup" else run(args))


if __name__ == "__main__":
    main()
