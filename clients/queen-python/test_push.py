"""Pushes: single, batch, duplicates, buffered, empty."""

import uuid

from comb_client import pop_builder, session


def test_single_and_batch_pushes_answer_per_item(url, name):
    async def body(q):
        one = await q.queue(name).push({"data": {"n": 0}})
        many = await q.queue(name).push([{"data": {"n": i}} for i in range(1, 11)])
        popped = await pop_builder(q, name, batch=20).pop()
        await q.ack(popped, True)
        return one, many, popped

    one, many, popped = session(url, body)
    assert len(one) == 1 and one[0]["status"] == "queued"
    assert [r["index"] for r in many] == list(range(10))
    assert all(r["status"] == "queued" and r["message_id"] for r in many)
    assert [m["data"]["n"] for m in popped] == list(range(11))


def test_a_duplicate_transaction_id_is_reported_and_stored_once(url, name):
    tx = str(uuid.uuid4())
    seen = []

    async def on_duplicate(items, error):
        seen.extend(items)

    async def body(q):
        first = await q.queue(name).push({"data": {"n": 1}, "transactionId": tx})
        second = await q.queue(name).push({"data": {"n": 2}, "transactionId": tx}).on_duplicate(
            on_duplicate
        )
        popped = await pop_builder(q, name, batch=10).pop()
        return first, second, popped

    first, second, popped = session(url, body)
    assert first[0]["status"] == "queued"
    assert second[0]["status"] == "duplicate"
    assert second[0]["message_id"] == first[0]["message_id"]
    assert len(seen) == 1
    assert [m["data"] for m in popped] == [{"n": 1}]


def test_buffered_pushes_arrive_when_flushed(url, name):
    async def body(q):
        results = []
        for i in range(5):
            builder = q.queue(name).buffer({"message_count": 100, "time_millis": 60_000})
            results.append(await builder.push({"data": {"n": i}}))
        before = await pop_builder(q, name, batch=10).pop()
        await q.flush_all_buffers()
        after = await pop_builder(q, name, batch=10).pop()
        return results, before, after

    results, before, after = session(url, body)
    assert all(r["buffered"] is True for r in results)
    assert before == []
    assert sorted(m["data"]["n"] for m in after) == list(range(5))


def test_an_empty_push_answers_an_empty_list(url, name):
    async def body(q):
        return await q.queue(name).push([])

    assert session(url, body) == []


def test_trace_ids_travel_with_the_message(url, name):
    trace = str(uuid.uuid4())

    async def body(q):
        await q.queue(name).push({"data": {"n": 1}, "traceId": trace})
        return await pop_builder(q, name).pop()

    popped = session(url, body)
    assert popped[0]["traceId"] == trace
