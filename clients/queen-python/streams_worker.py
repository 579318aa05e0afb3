"""A streams runner in a process of its own, for the recovery test to kill: Queen's streams SDK,
unmodified, summing `v` per partition in one-second tumbling windows into a sink queue.

Usage: python streams_worker.py URL SOURCE SINK QUERY
Prints "cycle" after each committed cycle (flushes included) and runs until killed.
"""

import asyncio
import os
import sys

from queen import Queen
from queen.streams import Stream


def pipeline(queen, source, sink):
    """The recovery test's pipeline: the worker and the test build the same one."""
    return (
        Stream.from_(queen.queue(source))
        # No idle flush: windows close when a later message arrives (the test's closer), so
        # only the partition's own cycles, ordered by its lease, emit them.
        .window_tumbling(seconds=1, idle_flush_ms=0)
        .aggregate({"count": lambda m: 0 if m.get("closer") else 1, "sum": lambda m: m.get("v", 0)})
        .to(queen.queue(sink))
    )


async def main(url, source, sink, query):
    token = os.environ.get("COMB_TOKEN") or None
    async with Queen(url=url, retry_attempts=1, bearer_token=token) as queen:
        runner = await pipeline(queen, source, sink).run(
            query_id=query, url=url, batch_size=3, bearer_token=token
        )
        seen = 0
        while True:
            m = runner.metrics()
            done = m["cyclesTotal"] + m["flushCyclesTotal"]
            # One line per committed cycle: several may commit between two looks.
            while seen < done:
                seen += 1
                print("cycle", flush=True)
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
