"""Consume loops: the client's own auto-ack, manual acks, batches, failures to the DLQ."""

from comb_client import pop_builder, session


def consumer(q, name):
    """A consume loop that stops once idle; handlers given one message at a time unless
    batch() is set (2.x hands lists to handlers by default)."""
    c = q.queue(name).timeout_millis(1000).idle_millis(3000)
    if hasattr(c, "autopilot"):
        c = c.autopilot(False)
    return c


def test_a_consume_loop_with_auto_ack_takes_everything_once(url, name):
    seen = []

    async def handler(message):
        seen.append(message["data"]["n"])

    async def body(q):
        await q.queue(name).push([{"data": {"n": i}} for i in range(5)])
        await consumer(q, name).each().limit(5).consume(handler)
        return await pop_builder(q, name).pop()

    rest = session(url, body)
    assert seen == list(range(5))
    assert rest == []


def test_a_consume_loop_with_manual_acks(url, name):
    results = []

    async def body(q):
        async def handler(message):
            results.append(await q.ack(message, True))

        await q.queue(name).push([{"data": {"n": i}} for i in range(3)])
        await consumer(q, name).each().auto_ack(False).limit(3).consume(handler)
        return await pop_builder(q, name).pop()

    rest = session(url, body)
    assert len(results) == 3 and all(r["success"] for r in results)
    assert rest == []


def test_a_batch_consumer_gets_lists(url, name):
    batches = []

    async def handler(messages):
        batches.append([m["data"]["n"] for m in messages])

    async def body(q):
        await q.queue(name).push([{"data": {"n": i}} for i in range(6)])
        await consumer(q, name).batch(3).limit(6).consume(handler)

    session(url, body)
    assert sum(batches, []) == list(range(6))
    assert all(len(b) <= 3 for b in batches)


def test_a_failing_handler_retries_then_dead_letters(url, name):
    attempts = []

    async def handler(message):
        attempts.append(message.get("attempt"))
        raise RuntimeError("cannot process")

    async def body(q):
        await q.queue(name).config({"retry_limit": 1, "retry_delay": 0}).create()
        await q.queue(name).push({"data": {"poison": True}})
        await consumer(q, name).each().limit(2).consume(handler)
        dlq = await q.queue(name).dlq().get()
        rest = await pop_builder(q, name).pop()
        return dlq, rest

    dlq, rest = session(url, body)
    assert attempts == [1, 2]
    assert dlq["total"] == 1
    assert dlq["messages"][0]["data"] == {"poison": True}
    assert dlq["messages"][0]["retryCount"] == 2
    assert rest == []
