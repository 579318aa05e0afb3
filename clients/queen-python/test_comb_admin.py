"""What Queen's client has no method for, through plain HTTP beside it: dead-letter requeue
(in the original order), purge, and a seek of one partition. The data is made and read back
with Queen's client. On a Citus cluster (`ON_CITUS`) the requeue and the seek answer 501
`unsupported_on_cluster` and change nothing; purge works there as anywhere."""

from comb_client import ON_CITUS, assert_unsupported_on_cluster, pop_builder, session


def dead_letter(q, name, group, partition, failing):
    """Pops `partition` one message at a time for `group`, failing the numbers in `failing`
    (at retryLimit 0 each is a dead letter at once) and completing the others."""

    async def run():
        while True:
            got = await pop_builder(q, name).partition(partition).group(group).pop()
            if not got:
                return
            ok = got[0]["data"]["n"] not in failing
            await q.ack(got, ok, {"group": group, "error": None if ok else "poison"})

    return run()


def test_requeued_dead_letters_come_back_in_their_order_to_their_group_only(url, http, name):
    async def setup(q):
        await q.queue(name).config({"retry_limit": 0, "retry_delay": 0}).create()
        await q.queue(name).partition("p").push([{"data": {"n": i}} for i in range(8)])
        await dead_letter(q, name, "w", "p", {1, 4, 5, 7})
        other = await pop_builder(q, name, batch=10).group("other").pop()
        await q.ack(other, True, {"group": "other"})
        return await q.queue(name).dlq("w").get()

    dead = session(url, setup)
    assert sorted(m["data"]["n"] for m in dead["messages"]) == [1, 4, 5, 7]

    r = http.post("/api/v1/dlq/requeue", json={"queue": name, "consumerGroup": "w"})
    if ON_CITUS:
        assert_unsupported_on_cluster(r)

        async def unchanged(q):
            got = await pop_builder(q, name, batch=10).group("w").pop()
            return got, await q.queue(name).dlq("w").get()

        got, still = session(url, unchanged)
        assert got == [], "nothing was requeued"
        assert sorted(m["data"]["n"] for m in still["messages"]) == [1, 4, 5, 7]
        return
    assert r.status_code == 200, r.text
    assert r.json()["requeued"] == 4
    assert r.json()["consumerGroups"] == ["w"]
    again = http.post("/api/v1/dlq/requeue", json={"queue": name, "consumerGroup": "w"})
    assert again.json()["requeued"] == 0, "each dead letter is requeued once"

    async def read(q):
        got = await pop_builder(q, name, batch=10).group("w").pop()
        await q.ack(got, True, {"group": "w"})
        return got, await pop_builder(q, name, batch=10).group("other").pop()

    got, other = session(url, read)
    assert [m["data"]["n"] for m in got] == [1, 4, 5, 7], "in their original order"
    assert other == [], "another group does not see the copies"


def test_purge_drops_the_dead_letters_of_one_partition(url, http, name):
    async def setup(q):
        await q.queue(name).config({"retry_limit": 0, "retry_delay": 0}).create()
        for partition in ("a", "b"):
            await q.queue(name).partition(partition).push([{"data": {"n": i}} for i in range(3)])
            await dead_letter(q, name, "w", partition, {0, 2})

    session(url, setup)
    r = http.post("/api/v1/dlq/purge", json={"queue": name, "partition": "a"})
    assert r.status_code == 200, r.text
    assert r.json()["purged"] == 2

    async def read(q):
        return await q.queue(name).dlq("w").get()

    left = session(url, read)
    assert left["total"] == 2
    assert {m["partitionName"] for m in left["messages"]} == {"b"}
    r = http.post("/api/v1/dlq/purge", json={"queue": name + "-none"})
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == "queue_not_found"


def test_a_seek_of_one_partition_leaves_the_others(url, http, name):
    async def setup(q):
        for partition in ("a", "b"):
            await q.queue(name).partition(partition).push(
                [{"data": {"n": i, "p": partition}} for i in range(2)]
            )
        got = await pop_builder(q, name, batch=10, partitions=2).group("g").pop()
        await q.ack(got, True, {"group": "g"})
        return got

    first = session(url, setup)
    assert len(first) == 4
    r = http.post(
        f"/api/v1/consumer-groups/g/queues/{name}/partitions/a/seek", json={"toStart": True}
    )
    if ON_CITUS:
        assert_unsupported_on_cluster(r)

        async def unmoved(q):
            return await pop_builder(q, name, batch=10, partitions=2).group("g").pop()

        assert session(url, unmoved) == [], "the group was not moved"
        return
    assert r.status_code == 200, r.text
    assert r.json()["partitionsMoved"] == 1
    assert r.json()["lag"] == 2

    async def read(q):
        return await pop_builder(q, name, batch=10, partitions=2).group("g").pop()

    again = session(url, read)
    assert [(m["data"]["p"], m["data"]["n"]) for m in again] == [("a", 0), ("a", 1)]
