"""What the tests share: running a client session, and the client's version."""

import asyncio
import importlib.metadata

from queen import Queen

CLIENT_VERSION = importlib.metadata.version("queen-mq")
# 0.x is the API Comb's compatibility is defined against; 2.x the newest client tested.
LEGACY = CLIENT_VERSION.startswith("0.")


def session(url, body):
    """Runs `body(queen)` with a client connected to `url`, closing it afterwards."""

    async def main():
        async with Queen(url, retry_attempts=1) as queen:
            return await body(queen)

    return asyncio.run(main())


def pop_builder(queen, name, **kw):
    """A queue builder for pops that does not wait; on 2.x, without the broker-sizing hints
    (Comb sizes pops by what the request asks, as Queen 0.15 did)."""
    # The client's builders long-poll by default (30 s); these pops look once unless asked.
    q = queen.queue(name).wait(False)
    if not LEGACY:
        q = q.autopilot(False)
    for key, value in kw.items():
        q = getattr(q, key)(value)
    return q

