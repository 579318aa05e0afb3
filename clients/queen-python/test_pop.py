"""Pops with and without waiting, acks, retries."""

import asyncio

from comb_client import pop_builder, session


def test_a_pop_of_an_empty_queue_returns_nothing(url, name):
    async def body(q):
        await q.queue(name).create()
        # Comb answers 204 without a body, as Queen does; the client reads it as "nothing".
        return await pop_builder(q, name).pop()

    assert session(url, body) == []


def test_a_waiting_pop_returns_what_is_pushed_meanwhile(url, name):
    async def body(q):
        await q.queue(name).create()
        waiting = asyncio.create_task(
            pop_builder(q, name, wait=True, timeout_millis=10_000).pop()
        )
        await asyncio.sleep(0.3)
        await q.queue(name).push({"data": {"late": True}})
        got = await waiting
        timed_out = await pop_builder(q, name, wait=True, timeout_millis=300).pop()
        return got, timed_out

    got, timed_out = session(url, body)
    assert [m["data"] for m in got] == [{"late": True}]
    assert timed_out == []


def test_acked_messages_are_gone_failed_ones_come_back(url, name):
    async def body(q):
        await q.queue(name).config({"retry_delay": 0}).create()
        await q.queue(name).push([{"data": {"n": i}} for i in range(3)])
        batch = await pop_builder(q, name, batch=3).pop()
        acked = await q.ack(batch[:2], True)
        failed = await q.ack(batch[2], False)
        again = await pop_builder(q, name, batch=3).pop()
        single = await q.ack(again[0], True)
        empty = await pop_builder(q, name).pop()
        return batch, acked, failed, again, single, empty

    batch, acked, failed, again, single, empty = session(url, body)
    assert [m["data"]["n"] for m in batch] == [0, 1, 2]
    assert all(m["leaseId"] == batch[0]["leaseId"] for m in batch)
    assert acked["success"] is True
    assert all(r["success"] for r in acked["results"])
    assert failed["success"] is True
    assert [m["data"]["n"] for m in again] == [2]
    assert again[0]["attempt"] == 2
    assert single["success"] is True
    assert empty == []


def test_an_ack_under_a_lease_that_is_not_the_messages_is_refused(url, name):
    async def body(q):
        await q.queue(name).push({"data": {"n": 1}})
        popped = await pop_builder(q, name).pop()
        forged = dict(popped[0], leaseId="00000000-0000-0000-0000-000000000000")
        refused = await q.ack(forged, True)
        ok = await q.ack(popped[0], True)
        return refused, ok

    refused, ok = session(url, body)
    assert refused["success"] is False
    assert "lease" in refused["error"]
    assert ok["success"] is True


def test_a_named_partition_is_popped_alone(url, name):
    async def body(q):
        await q.queue(name).partition("a").push({"data": "in a"})
        await q.queue(name).partition("b").push({"data": "in b"})
        got = await pop_builder(q, name).partition("b").pop()
        await q.ack(got, True)
        return got

    got = session(url, body)
    assert [(m["partition"], m["data"]) for m in got] == [("b", "in b")]
