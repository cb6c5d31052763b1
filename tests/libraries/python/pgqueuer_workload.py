"""A workload that pgqueuer runs on its own tables, for tests/preset_python.rs.

    python pgqueuer_workload.py --db postgres://... --schema s --phase setup|run \
        [--ok 140 --flaky 40 --doomed 20 --dups 40]

`--phase setup` installs pgqueuer's own schema (the `pgqueuer` queue, the append-only
`pgqueuer_log`, `pgqueuer_statistics`, their types and triggers) into `--schema`
through the library's Queries.install, with `search_path` set to that schema.

`--phase run` enqueues ok + flaky + doomed jobs through the library's API over two
entrypoints, each with a dedupe key of its own, then enqueues `--dups` of them again
with the same dedupe key while the first is still queued: the library refuses each
(DuplicateJobError). A queue manager of the library then runs them with its
database-level retries (DatabaseRetryEntrypointExecutor, max_attempts=2: three
attempts): `ok` jobs succeed, `flaky` ones fail their first two attempts and then
succeed, `doomed` ones always fail. `send_email` holds a job that failed for good
(on_failure="hold": its row stays, status `failed`); `charge_card` deletes it (the
default: logged as `exception`); every finished row is deleted from `pgqueuer`, only
the log keeps it. When nothing is left queued or picked (the library's queue_size)
and every job's last attempt has returned, it stops the manager and prints ONE JSON
object with the library's counts per entrypoint: enqueued, rejected duplicates,
succeeded, failed for good (its log_statistics), and attempts per job at completion
(the runs the handlers saw).
"""

import argparse
import asyncio
import collections
import json
import logging
import re
import sys
import time
from datetime import timedelta

import asyncpg
import pgqueuer
from pgqueuer import AsyncpgDriver, DatabaseRetryEntrypointExecutor, Queries, QueueManager
from pgqueuer.domain.errors import DuplicateJobError

ENTRYPOINTS = {"send_email": "hold", "charge_card": "delete"}
FLAKY_FAILURES = 2


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


async def connect(args):
    return await asyncpg.connect(args.db, server_settings={"search_path": args.schema})


async def setup(args):
    conn = await connect(args)
    await Queries(AsyncpgDriver(conn)).install()
    await conn.close()


def retries(parameters):
    return DatabaseRetryEntrypointExecutor(
        parameters=parameters, max_attempts=2, initial_delay=timedelta(0)
    )


async def run(args):
    conn = await connect(args)
    queries = Queries(AsyncpgDriver(conn))
    kinds = ["ok"] * args.ok + ["flaky"] * args.flaky + ["doomed"] * args.doomed
    names = list(ENTRYPOINTS)
    plan = {}
    enqueued = collections.Counter()
    rejected = collections.Counter()
    for i, kind in enumerate(kinds):
        entrypoint = names[i % len(names)]
        key = f"{kind}-{i}"
        plan[key] = (entrypoint, kind)
        await queries.enqueue(entrypoint, key.encode(), dedupe_key=key)
        enqueued[entrypoint] += 1
    # Re-sends of existing keys while their first job is still queued: refused.
    for i in range(min(args.dups, len(kinds))):
        key = f"{kinds[i]}-{i}"
        entrypoint, _ = plan[key]
        try:
            await queries.enqueue(entrypoint, key.encode(), dedupe_key=key)
            enqueued[entrypoint] += 1
        except DuplicateJobError:
            rejected[entrypoint] += 1

    worker_conn = await connect(args)
    qm = QueueManager(Queries(AsyncpgDriver(worker_conn)))
    runs = collections.Counter()
    done = {}

    def register(entrypoint, on_failure):
        @qm.entrypoint(entrypoint, on_failure=on_failure, executor_factory=retries)
        async def handler(job):
            key = job.payload.decode()
            runs[key] += 1
            _, kind = plan[key]
            if kind == "doomed" or (kind == "flaky" and job.attempts < FLAKY_FAILURES):
                if kind == "doomed" and job.attempts >= 2:
                    done[key] = "failed"
                raise RuntimeError(f"{kind} job {key} fails (attempt {job.attempts + 1})")
            done[key] = "succeeded"

    for entrypoint, on_failure in ENTRYPOINTS.items():
        register(entrypoint, on_failure)

    worker = asyncio.create_task(
        qm.run(dequeue_timeout=timedelta(seconds=1), batch_size=10, log_aggregation_interval=timedelta(0))
    )
    deadline = time.monotonic() + args.deadline_s
    while True:
        waiting = [s for s in await queries.queue_size() if s.status in ("queued", "picked")]
        if len(done) == len(kinds) and not waiting:
            break
        if worker.done() or time.monotonic() > deadline:
            print(f"deadline passed: {len(done)} jobs done, still {waiting}", file=sys.stderr)
            if worker.done():
                worker.result()
            sys.exit(1)
        await asyncio.sleep(0.2)
    qm.shutdown.set()
    await asyncio.wait_for(worker, 30)

    # The library's own counts of its log, by entrypoint and status.
    stats = collections.Counter()
    for s in await queries.log_statistics(limit=10_000):
        stats[(s.entrypoint, s.status)] += s.count
    by_entrypoint = {}
    for entrypoint in names:
        counts = {
            "enqueued": enqueued[entrypoint],
            "rejected_duplicates": rejected[entrypoint],
            "succeeded": stats[(entrypoint, "successful")],
            "failed": stats[(entrypoint, "exception")] + stats[(entrypoint, "failed")],
            "log": {status: c for (e, status), c in sorted(stats.items()) if e == entrypoint},
            "attempts": {"succeeded": {}, "failed": {}},
        }
        for key, (e, _) in plan.items():
            if e == entrypoint:
                a = counts["attempts"][done[key]]
                a[str(runs[key])] = a.get(str(runs[key]), 0) + 1
        by_entrypoint[entrypoint] = counts
    await conn.close()
    await worker_conn.close()
    print(json.dumps({"library": "pgqueuer", "version": pgqueuer.__version__, "by_entrypoint": by_entrypoint}))


def main():
    args = parse()
    # The failures are the workload's design: the manager's error log would only
    # drown a real problem.
    logging.basicConfig(level=logging.CRITICAL)
    logging.getLogger("pgqueuer").setLevel(logging.CRITICAL)
    asyncio.run(setup(args) if args.phase == "setup" else run(args))


if __name__ == "__main__":
    main()
