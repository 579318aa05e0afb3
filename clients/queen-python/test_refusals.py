"""With tokens required, what a client without the right token gets: 401 without a token
(everywhere but health), 403 with a reader's token on a push and on administrative writes —
and nothing changed by them. Collected only when COMB_READ_TOKEN names a reader's token
(see conftest.py), with COMB_TOKEN an administrator's; `queen_python.rs` runs it alone against
a server requiring tokens, after the whole suite passed there with the administrator's token."""

import os

import httpx
import pytest

from comb_client import LEGACY, http, session

READER = os.environ.get("COMB_READ_TOKEN")
ADMIN = os.environ.get("COMB_TOKEN")


def refused(error):
    assert isinstance(error, httpx.HTTPStatusError), repr(error)
    response = error.response
    assert response.headers["content-type"].startswith("application/problem+json")
    return response.status_code, response.json()["code"]


def test_without_a_token_only_health_answers(url, name):
    async def body(q):
        health = await q.admin.health()
        out = []
        for call in (
            lambda: q.queue(name).push([{"data": {"n": 0}}]),
            lambda: q.queue(name).create(),
            lambda: q.admin.list_queues(),
            lambda: q.admin.get_overview(),
            lambda: q.admin.seek_consumer_group("g", name, {"toEnd": True}),
        ):
            with pytest.raises(Exception) as error:
                await call()
            out.append(refused(error.value))
        return health, out

    health, out = session(url, body, token=None)
    # Queen's fields as Queen answers them; Comb adds its release and schema version.
    assert {k: health[k] for k in ("status", "database")} == {"status": "healthy", "database": "connected"}
    assert health["version"] and health["schemaVersion"] >= 20
    assert [status for status, _ in out] == [401] * 5
    assert {code for _, code in out} == {"missing_token"}
    with http(url, token=None) as plain:
        r = plain.get("/api/v1/resources/queues")
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
    with http(url, token="not-a-token") as forged:
        r = forged.post("/api/v1/push", json={"items": [{"queue": name, "payload": 1}]})
        assert r.status_code == 401
        assert r.json()["code"] == "invalid_token"


def test_a_reader_reads_but_may_not_push_or_administer(url, name):
    async def body(q):
        listed = await q.admin.list_queues()
        out = []
        writes = [
            lambda: q.queue(name).push([{"data": {"n": 0}}]),
            lambda: q.admin.seek_consumer_group("g", name, {"toEnd": True}),
            lambda: q.admin.delete_consumer_group_for_queue("g", name),
        ]
        if LEGACY:
            writes.append(lambda: q.admin.set_maintenance_mode(True))
        for call in writes:
            with pytest.raises(Exception) as error:
                await call()
            out.append(refused(error.value))
        return listed, out

    listed, out = session(url, body, token=READER)
    assert "queues" in listed
    assert [status for status, _ in out] == [403] * len(out)
    assert {code for _, code in out} == {"forbidden"}
    if LEGACY:
        # Read with the administrator's token: the refused write changed nothing.
        async def mode(q):
            return await q.admin.get_maintenance_mode()

        assert session(url, mode, token=ADMIN)["enabled"] is False
    with http(url, token=READER) as reader:
        r = reader.get(f"/api/v1/messages?queue={name}")
        assert r.status_code == 404, "read through: the queue was never made"
        assert r.json()["code"] == "queue_not_found"
