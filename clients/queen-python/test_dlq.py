"""The dead-letter listing as the client reads it."""

from comb_client import pop_builder, session


def test_dead_letters_are_listed_by_queue_and_group(url, name):
    async def body(q):
        await q.queue(name).config({"retry_limit": 0}).create()
        await q.queue(name).push([{"data": {"n": i}} for i in range(3)])
        for group in (None, "workers"):
            got = await pop_builder(q, name, batch=3).group(group).pop() if group else await pop_builder(q, name, batch=3).pop()
            ctx = {"group": group, "error": "boom"} if group else {"error": "boom"}
            await q.ack(got, False, ctx)
        everything = await q.queue(name).dlq().get()
        workers = await q.queue(name).dlq("workers").get()
        page = await q.queue(name).dlq().limit(2).offset(2).get()
        return everything, workers, page

    everything, workers, page = session(url, body)
    assert everything["total"] == 6
    assert workers["total"] == 3
    assert all(m["consumerGroup"] == "workers" for m in workers["messages"])
    assert sorted(m["data"]["n"] for m in workers["messages"]) == [0, 1, 2]
    assert all(m["errorMessage"] == "boom" and m["queueName"] == name for m in workers["messages"])
    assert len(page["messages"]) == 2
    ids = {m["id"] for m in everything["messages"]}
    assert {m["id"] for m in page["messages"]} <= ids
