"""Encrypted queues: what the client pushes comes back as it was, in pops and the DLQ."""

from comb_client import pop_builder, session


def test_an_encrypted_queue_round_trips_payloads(url, name):
    secret = {"card": "4111 1111 1111 1111", "nested": [1, {"ok": True}]}

    async def body(q):
        created = await q.queue(name).config({"encryption_enabled": True, "retry_limit": 0}).create()
        await q.queue(name).push([{"data": secret}, {"data": "second"}])
        got = await pop_builder(q, name, batch=2).pop()
        await q.ack(got[0], "failed", {"error": "rejected"})
        dlq = await q.queue(name).dlq().get()
        return created, got, dlq

    created, got, dlq = session(url, body)
    assert created["options"]["encryptionEnabled"] is True
    assert [m["data"] for m in got] == [secret, "second"]
    assert dlq["messages"][0]["data"] == secret
