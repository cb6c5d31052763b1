"""The stream workload of tests/rabbitmq.rs: rstream (RabbitMQ's stream protocol,
Python) publishes into a stream queue and consumes it under stored offsets, as a
stream consumer does; it prints its own ground truth as JSON.

  --phase create   declare the stream (empty)
  --phase run      three batches of 100 messages, 3 s apart (each batch's start
                   and confirmed end time); then consumer "billing" processes
                   200 messages and stores the offset of the last (the end of
                   the second batch), "audit" 40, "done" all 300
  --phase hold     consumer "billing" attached, reading on from its stored
                   offset and storing nothing, until killed
"""

import argparse
import asyncio
import json
import sys
import time

from rstream import (
    AMQPMessage,
    ConfirmationStatus,
    Consumer,
    ConsumerOffsetSpecification,
    OffsetType,
    Producer,
)
from rstream.exceptions import OffsetNotFound

BATCHES = 3
PER_BATCH = 100
CONSUMERS = (("billing", 200), ("audit", 40), ("done", 300))


def connect(cls, a):
    return cls(a.host, a.port, vhost=a.vhost, username=a.user, password=a.password)


async def create(a):
    async with connect(Producer, a) as p:
        await p.create_stream(a.stream, exists_ok=True)
    return {}


async def publish(a):
    batches = []
    async with connect(Producer, a) as p:
        for b in range(BATCHES):
            confirmed = asyncio.Event()
            count = 0

            async def on_confirm(status: ConfirmationStatus):
                nonlocal count
                if not status.is_confirmed:
                    sys.exit(f"message {status.message_id} not confirmed")
                count += 1
                if count == PER_BATCH:
                    confirmed.set()

            start = time.time()
            await p.send_batch(
                a.stream,
                [AMQPMessage(body=f"b{b}-m{i}".encode()) for i in range(PER_BATCH)],
                on_publish_confirm=on_confirm,
            )
            await asyncio.wait_for(confirmed.wait(), 30)
            end = time.time()
            batches.append(
                {"first": b * PER_BATCH, "last": (b + 1) * PER_BATCH - 1, "start": start, "end": end}
            )
            if b < BATCHES - 1:
                await asyncio.sleep(3)
    return batches


async def consume(a, name, upto):
    """Processes the first `upto` messages as `name` and stores the last one's
    offset; returns that offset once the broker answers it back."""
    c = connect(Consumer, a)
    await c.start()
    seen = []
    done = asyncio.Event()

    async def on_message(msg, ctx):
        if len(seen) < upto:
            seen.append(ctx.offset)
            if len(seen) == upto:
                await c.store_offset(a.stream, name, ctx.offset)
                done.set()

    await c.subscribe(
        a.stream,
        on_message,
        offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
        subscriber_name=name,
    )
    await asyncio.wait_for(done.wait(), 30)
    if seen != list(range(upto)):
        sys.exit(f"{name} read offsets {seen[:5]}…, not 0..{upto - 1}")
    for _ in range(100):
        try:
            if await c.query_offset(a.stream, name) == seen[-1]:
                break
        except OffsetNotFound:
            pass
        await asyncio.sleep(0.1)
    else:
        sys.exit(f"{name}: the stored offset {seen[-1]} never read back")
    await c.close()
    return seen[-1]


async def run(a):
    batches = await publish(a)
    stored = {}
    for name, upto in CONSUMERS:
        stored[name] = await consume(a, name, upto)
    return {"batches": batches, "stored": stored}


async def hold(a):
    c = connect(Consumer, a)
    await c.start()
    stored = await c.query_offset(a.stream, "billing")

    async def on_message(msg, ctx):
        pass

    await c.subscribe(
        a.stream,
        on_message,
        offset_specification=ConsumerOffsetSpecification(OffsetType.OFFSET, stored + 1),
        subscriber_name="billing",
    )
    print(json.dumps({"attached": True}), flush=True)
    while True:
        await asyncio.sleep(3600)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5552)
    ap.add_argument("--vhost", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    ap.add_argument("--phase", choices=["create", "run", "hold"], required=True)
    a = ap.parse_args()
    out = asyncio.run({"create": create, "run": run, "hold": hold}[a.phase](a))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
