"""What the tests share: running a client session, plain HTTP for what Queen's client lacks,
the bearer token both carry, the client's version, and whether the server runs on Citus."""

import asyncio
import importlib.metadata
import os

import httpx
from queen import Queen

CLIENT_VERSION = importlib.metadata.version("queen-mq")
# 0.x is the API Comb's compatibility is defined against; 2.x the newest client tested.
LEGACY = CLIENT_VERSION.startswith("0.")

# The bearer token every request carries when the server requires tokens (set by
# `queen_python.rs` to an administrator's); unset against an open server.
TOKEN = os.environ.get("COMB_TOKEN") or None

# Whether the server under test runs on a Citus cluster (COMB_TEST_BACKEND=citus, as the Rust
# suite reads it). There the administrative actions that move cursors or requeue answer 501
# `unsupported_on_cluster` and change nothing (docs/scale-out.md, "Not yet").
ON_CITUS = os.environ.get("COMB_TEST_BACKEND") == "citus"


def session(url, body, token=TOKEN):
    """Runs `body(queen)` with a client connected to `url`, closing it afterwards."""

    async def main():
        # By keyword: 0.15 drops every keyword option when the URL comes positionally.
        async with Queen(url=url, retry_attempts=1, bearer_token=token) as queen:
            return await body(queen)

    return asyncio.run(main())


def http(url, token=TOKEN):
    """A plain HTTP client of `url` (httpx, which Queen's client is built on) carrying `token`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


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



def assert_unsupported_on_cluster(response):
    """`response` (an httpx response, or the HTTPStatusError Queen's client raised for it) is
    the refusal a Citus cluster gives an action it does not run: 501, problem+json, code
    `unsupported_on_cluster`."""
    if isinstance(response, Exception):
        assert isinstance(response, httpx.HTTPStatusError), repr(response)
        response = response.response
    assert response.status_code == 501, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "unsupported_on_cluster", response.text
