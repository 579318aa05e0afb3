"""Queen's `Admin` object (`queen.admin`, a method per administration route) against Comb.

Every public method of the installed client's `Admin` is called here with data set up through
the client itself (push, pop, ack, fail to the dead letters, a consume loop's traces), and its
answer is read for what it says: counts, the message found, lag, a seek that moves delivery, a
retried dead letter delivered again, maintenance that holds pushes. `test_every_public_method_is_called`
keeps the list honest for each client version. One server serves the whole run and pytest runs
one test at a time, so database-wide figures are compared before and after.

On a Citus cluster (`ON_CITUS`) the actions that move cursors or requeue (clear, delete, retry
and dead-letter a message, seek, delete a group's cursors) answer 501 `unsupported_on_cluster`:
their tests assert that answer and that delivery goes on as if nothing had been asked.
"""

import asyncio
import inspect
import re
import sys
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from queen.admin.admin import Admin

from comb_client import LEGACY, ON_CITUS, assert_unsupported_on_cluster, pop_builder, session

# Each public method of `Admin` and the test calling it. 0.15.0 has them all but
# get_queue_depth; 2.6.0 dropped the maintenance modes and get_postgres_stats, and raises
# NotImplementedError from clear_queue and move_message_to_dlq before any request.
CALLED_BY = {
    "get_overview": "test_overview_namespaces_and_tasks_count_what_was_pushed",
    "get_namespaces": "test_overview_namespaces_and_tasks_count_what_was_pushed",
    "get_tasks": "test_overview_namespaces_and_tasks_count_what_was_pushed",
    "list_queues": "test_queues_and_partitions_show_depth_in_flight_and_dead_letters",
    "get_queue": "test_queues_and_partitions_show_depth_in_flight_and_dead_letters",
    "get_partitions": "test_queues_and_partitions_show_depth_in_flight_and_dead_letters",
    "clear_queue": "test_clear_queue_passes_what_is_pending",
    "list_messages": "test_messages_are_listed_found_and_deleted",
    "get_message": "test_messages_are_listed_found_and_deleted",
    "delete_message": "test_messages_are_listed_found_and_deleted",
    "retry_message": "test_a_retried_dead_letter_is_delivered_again",
    "move_message_to_dlq": "test_a_message_moved_to_the_dead_letters_is_not_delivered",
    "get_traces_for_message": "test_traces_recorded_by_a_consumer_are_read_back",
    "get_traces_by_name": "test_traces_recorded_by_a_consumer_are_read_back",
    "get_trace_names": "test_traces_recorded_by_a_consumer_are_read_back",
    "get_status": "test_status_and_analytics_count_what_the_client_did",
    "get_queue_stats": "test_status_and_analytics_count_what_the_client_did",
    "get_queue_detail": "test_status_and_analytics_count_what_the_client_did",
    "get_analytics": "test_status_and_analytics_count_what_the_client_did",
    "get_worker_metrics": "test_status_and_analytics_count_what_the_client_did",
    "get_system_metrics": "test_system_metrics_and_postgres_statistics",
    "get_postgres_stats": "test_system_metrics_and_postgres_statistics",
    "list_consumer_groups": "test_consumer_groups_show_lag_and_the_lagging_ones",
    "get_consumer_group": "test_consumer_groups_show_lag_and_the_lagging_ones",
    "get_lagging_consumers": "test_consumer_groups_show_lag_and_the_lagging_ones",
    "refresh_consumer_stats": "test_consumer_groups_show_lag_and_the_lagging_ones",
    "seek_consumer_group": "test_seek_moves_what_a_group_is_handed",
    "delete_consumer_group_for_queue": "test_a_group_deleted_for_a_queue_starts_again",
    "health": "test_health_and_metrics",
    "metrics": "test_health_and_metrics",
    "get_maintenance_mode": "test_push_maintenance_answers_503_and_stores_nothing",
    "set_maintenance_mode": "test_push_maintenance_answers_503_and_stores_nothing",
    "get_pop_maintenance_mode": "test_pop_maintenance_hands_out_nothing",
    "set_pop_maintenance_mode": "test_pop_maintenance_hands_out_nothing",
    "get_queue_depth": "test_queue_depth_is_a_later_brokers_route",
}
ONLY_LEGACY = {
    "get_maintenance_mode",
    "set_maintenance_mode",
    "get_pop_maintenance_mode",
    "set_pop_maintenance_mode",
    "get_postgres_stats",
}
ONLY_LATER = {"get_queue_depth"}

def public_methods():
    return {
        n
        for n, f in inspect.getmembers(Admin, inspect.iscoroutinefunction)
        if not n.startswith("_")
    }


def test_every_public_method_is_called():
    expected = set(CALLED_BY) - (ONLY_LATER if LEGACY else ONLY_LEGACY)
    assert public_methods() == expected
    module = sys.modules[__name__]
    for method, test in CALLED_BY.items():
        source = inspect.getsource(getattr(module, test))
        assert re.search(rf"admin\.{method}\b", source), f"{test} does not call {method}"


def items(n, start=0):
    return [{"data": {"n": i}} for i in range(start, start + n)]


def numbers(messages):
    return [m["data"]["n"] for m in messages]


def by(entries, key, value):
    found = [e for e in entries if e.get(key) == value]
    assert len(found) == 1, f"{key}={value!r} in {entries}"
    return found[0]


def status_of(error):
    assert isinstance(error, httpx.HTTPStatusError), repr(error)
    return error.response.status_code


async def refused(call):
    """The error `call` (an admin method's coroutine) raised; it must raise."""
    with pytest.raises(Exception) as error:
        await call
    return error.value


def test_overview_namespaces_and_tasks_count_what_was_pushed(url, name):
    ns, task = name + "-ns", name + "-task"

    async def body(q):
        before = await q.admin.get_overview()
        await q.queue(name).namespace(ns).task(task).create()
        await q.queue(name).partition("a").push(items(3))
        await q.queue(name).partition("b").push(items(2))
        after = await q.admin.get_overview()
        return before, after, await q.admin.get_namespaces(), await q.admin.get_tasks()

    before, after, namespaces, tasks = session(url, body)
    assert after["queues"] == before["queues"] + 1
    assert after["partitions"] == before["partitions"] + 2
    assert after["messages"]["total"] == before["messages"]["total"] + 5
    assert after["messages"]["pending"] == before["messages"]["pending"] + 5
    entry = by(namespaces["namespaces"], "namespace", ns)
    assert entry["queues"] == 1
    assert entry["messages"]["total"] == 5
    entry = by(tasks["tasks"], "task", task)
    assert entry["queues"] == 1
    assert entry["messages"]["pending"] == 5


def test_queues_and_partitions_show_depth_in_flight_and_dead_letters(url, name):
    ns = name + "-ns"

    async def body(q):
        await q.queue(name).namespace(ns).config({"retry_limit": 0, "retry_delay": 0}).create()
        await q.queue(name).partition("a").push(items(4))
        await q.queue(name).partition("b").push(items(2, 10))
        leased = await pop_builder(q, name, batch=2).partition("a").pop()
        listed = await q.admin.list_queues(namespace=ns)
        # The first fails: at retryLimit 0 it is a dead letter, and the lease ends.
        await q.ack(leased[0], False, {"error": "boom"})
        detail = await q.admin.get_queue(name)
        partitions = await q.admin.get_partitions(queue=name)
        one = await q.admin.get_partitions(queue=name, limit=1, offset=1)
        return leased, listed, detail, partitions, one

    leased, listed, detail, partitions, one = session(url, body)
    assert numbers(leased) == [0, 1]
    assert listed["total"] == 1
    entry = by(listed["queues"], "name", name)
    assert entry["namespace"] == ns
    assert entry["partitions"] == 2
    assert entry["messages"]["total"] == 6
    assert entry["messages"]["processing"] == 2
    assert entry["messages"]["pending"] == 4
    assert entry["deadLetters"] == 0
    assert entry["oldestPendingAgeSeconds"] >= 0
    assert detail["name"] == name
    assert detail["deadLetters"] == 1
    assert detail["messages"]["processing"] == 0
    assert detail["messages"]["pending"] == 5
    parts = {p["name"]: p for p in detail["partitionList"]}
    assert set(parts) == {"a", "b"}
    assert parts["a"]["messages"]["total"] == 4
    assert parts["a"]["messages"]["pending"] == 3
    assert parts["b"]["messages"]["pending"] == 2
    assert [g["name"] for g in detail["consumerGroups"]] == ["__QUEUE_MODE__"]
    assert partitions["total"] == 2
    assert {p["queue"] for p in partitions["partitions"]} == {name}
    assert [p["name"] for p in partitions["partitions"]] == ["a", "b"]
    assert [p["name"] for p in one["partitions"]] == ["b"]


def test_clear_queue_passes_what_is_pending(url, name):
    async def body(q):
        await q.queue(name).partition("a").push(items(3))
        await q.queue(name).partition("b").push(items(2, 10))
        if not LEGACY:
            # 2.x refuses before sending anything: the messages stay.
            with pytest.raises(NotImplementedError):
                await q.admin.clear_queue(name)
            return None, None, await pop_builder(q, name, batch=10, partitions=2).pop()
        if ON_CITUS:
            # Refused, of one partition or of the queue: every message is still handed out.
            one = await refused(q.admin.clear_queue(name, "b"))
            everything = await refused(q.admin.clear_queue(name))
            return one, everything, await pop_builder(q, name, batch=10, partitions=2).pop()
        one = await q.admin.clear_queue(name, "b")
        rest = await pop_builder(q, name, batch=10, partitions=2).pop()
        await q.ack(rest, True)
        await q.queue(name).partition("a").push(items(2, 20))
        everything = await q.admin.clear_queue(name)
        return one, everything, rest + await pop_builder(q, name, batch=10, partitions=2).pop()

    one, everything, got = session(url, body)
    if not LEGACY:
        assert sorted(numbers(got)) == [0, 1, 2, 10, 11]
        return
    if ON_CITUS:
        assert_unsupported_on_cluster(one)
        assert_unsupported_on_cluster(everything)
        assert sorted(numbers(got)) == [0, 1, 2, 10, 11], "nothing was cleared"
        return
    assert one["messagesCleared"] == 2 and one["partition"] == "b"
    assert everything["messagesCleared"] == 2 and everything["partition"] is None
    assert numbers(got) == [0, 1, 2], "b and the later pushes were cleared"


def test_messages_are_listed_found_and_deleted(url, name):
    async def body(q):
        pushed = await q.queue(name).push(items(4))
        leased = await pop_builder(q, name).pop()
        pending = await q.admin.list_messages(queue=name, status="pending")
        everything = await q.admin.list_messages(queue=name, limit=2)
        pid, tx = pushed[2]["partition_id"], pushed[2]["transaction_id"]
        found = await q.admin.get_message(pid, tx)
        if ON_CITUS:
            deleted = await refused(q.admin.delete_message(pid, tx))
        else:
            deleted = await q.admin.delete_message(pid, tx)
        await q.ack(leased, True)
        rest = await pop_builder(q, name, batch=10).pop()
        with pytest.raises(Exception) as gone:
            await q.admin.get_message(pid, "no-such-transaction")
        return leased, pending, everything, found, deleted, rest, gone.value

    leased, pending, everything, found, deleted, rest, gone = session(url, body)
    assert numbers(leased) == [0]
    assert sorted(m["data"]["n"] for m in pending["messages"]) == [1, 2, 3]
    assert all(m["status"] == "pending" and m["queue"] == name for m in pending["messages"])
    assert len(everything["messages"]) == 2
    assert found["data"] == {"n": 2}
    assert found["consumerGroups"][0]["status"] == "pending"
    assert status_of(gone) == 404
    if ON_CITUS:
        assert_unsupported_on_cluster(deleted)
        assert numbers(rest) == [1, 2, 3], "the message refused deletion is handed out"
        return
    assert deleted["deleted"] is True
    assert numbers(rest) == [1, 3], "the deleted message is not handed out"


def test_a_retried_dead_letter_is_delivered_again(url, name):
    async def body(q):
        await q.queue(name).config({"retry_limit": 0, "retry_delay": 0}).create()
        await q.queue(name).push(items(2))
        got = await pop_builder(q, name, batch=2).pop()
        # The success first: a failure ends the lease.
        await q.ack(got[1], True)
        await q.ack(got[0], False, {"error": "poison"})
        dead = await q.admin.list_messages(queue=name, status="dead_letter")
        nothing = await pop_builder(q, name).pop()
        m = got[0]
        if ON_CITUS:
            retried = await refused(q.admin.retry_message(m["partitionId"], m["transactionId"]))
            again = await pop_builder(q, name).pop()
            still = await q.admin.list_messages(queue=name, status="dead_letter")
            return dead, nothing, retried, again, still
        retried = await q.admin.retry_message(m["partitionId"], m["transactionId"])
        again = await pop_builder(q, name).pop()
        await q.ack(again, True)
        return dead, nothing, retried, again, None

    dead, nothing, retried, again, still = session(url, body)
    assert [m["data"] for m in dead["messages"]] == [{"n": 0}]
    assert dead["messages"][0]["status"] == "dead_letter"
    assert nothing == []
    if ON_CITUS:
        assert_unsupported_on_cluster(retried)
        assert again == [], "the refused retry requeued nothing"
        assert [m["data"] for m in still["messages"]] == [{"n": 0}], "still a dead letter"
        return
    assert retried["retried"] is True and retried["requeued"] == 1
    assert numbers(again) == [0]


def test_a_message_moved_to_the_dead_letters_is_not_delivered(url, name):
    async def body(q):
        pushed = await q.queue(name).push(items(3))
        pid, tx = pushed[1]["partition_id"], pushed[1]["transaction_id"]
        if not LEGACY:
            # 2.x refuses before sending anything: the message stays deliverable.
            with pytest.raises(NotImplementedError):
                await q.admin.move_message_to_dlq(pid, tx)
            return None, None, await pop_builder(q, name, batch=10).pop()
        if ON_CITUS:
            moved = await refused(q.admin.move_message_to_dlq(pid, tx))
            dlq = await q.queue(name).dlq().get()
            return moved, dlq, await pop_builder(q, name, batch=10).pop()
        moved = await q.admin.move_message_to_dlq(pid, tx)
        dlq = await q.queue(name).dlq().get()
        return moved, dlq, await pop_builder(q, name, batch=10).pop()

    moved, dlq, got = session(url, body)
    if not LEGACY:
        assert numbers(got) == [0, 1, 2]
        return
    if ON_CITUS:
        assert_unsupported_on_cluster(moved)
        assert dlq["messages"] == []
        assert numbers(got) == [0, 1, 2], "the message refused the dead letters is handed out"
        return
    assert moved["success"] is True
    assert [m["data"] for m in dlq["messages"]] == [{"n": 1}]
    assert numbers(got) == [0, 2]


def test_traces_recorded_by_a_consumer_are_read_back(url, name):
    trace = name + "-order"
    recorded = []

    async def handler(message):
        n = message["data"]["n"]
        recorded.append(
            await message["trace"](
                {"traceName": [trace, name + "-all"], "eventType": "processed", "data": {"n": n}}
            )
        )

    async def body(q):
        pushed = await q.queue(name).push(items(2))
        c = q.queue(name).timeout_millis(1000).idle_millis(2000)
        if hasattr(c, "autopilot"):
            c = c.autopilot(False)
        await c.each().limit(2).consume(handler)
        first = pushed[0]
        of_message = await q.admin.get_traces_for_message(
            first["partition_id"], first["transaction_id"]
        )
        named = await q.admin.get_traces_by_name(trace)
        page = await q.admin.get_traces_by_name(trace, limit=1)
        names = await q.admin.get_trace_names(limit=1000)
        return of_message, named, page, names

    of_message, named, page, names = session(url, body)
    assert [r["success"] for r in recorded] == [True, True]
    assert len(of_message["traces"]) == 1
    assert of_message["traces"][0]["data"] == {"n": 0}
    assert of_message["traces"][0]["eventType"] == "processed"
    assert sorted(of_message["traces"][0]["traceNames"]) == sorted([trace, name + "-all"])
    assert sorted(t["data"]["n"] for t in named["traces"]) == [0, 1]
    assert all(t["queue"] == name for t in named["traces"])
    assert len(page["traces"]) == 1
    listed = {n["name"] for n in names["names"]}
    assert {trace, name + "-all"} <= listed


async def settled_totals(q, **params):
    """Analytics totals once every server wrote its counters (two reads 1 s apart agree)."""
    last = None
    for _ in range(30):
        now = (await q.admin.get_analytics(**params))["totals"]
        if now == last:
            return now
        last = now
        await asyncio.sleep(1)
    raise AssertionError(f"analytics never settled: {last}")


def test_status_and_analytics_count_what_the_client_did(url, name):
    async def body(q):
        await q.queue(name).config({"retry_limit": 0, "retry_delay": 0}).create()
        # Throughput of one queue, counted by each server per queue: read before and after
        # (the queue is new, so before is zero).
        before = await settled_totals(q, queue=name)
        status_before = await q.admin.get_status()
        await q.queue(name).push(items(4))
        got = await pop_builder(q, name, batch=4).pop()
        await q.ack(got[:3], True)
        await q.ack(got[3], False, {"error": "boom"})
        # Each server writes its per-minute counters every --stats-interval-ms.
        for _ in range(100):
            analytics = await q.admin.get_analytics(queue=name)
            if analytics["totals"]["deadLettered"] > before["deadLettered"]:
                break
            await asyncio.sleep(0.1)
        after = await settled_totals(q, queue=name)
        status = await q.admin.get_status()
        stats = await q.admin.get_queue_stats(limit=1000)
        detail = await q.admin.get_queue_detail(name)
        since = (datetime.now(timezone.utc) - timedelta(minutes=5)).isoformat()
        workers = await q.admin.get_worker_metrics(**{"from": since})
        return before, status_before, analytics, after, status, stats, detail, workers

    before, status_before, analytics, after, status, stats, detail, workers = session(url, body)
    assert analytics["queue"] == name and analytics["bucketMinutes"] == 1
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"pushed": 4, "popped": 4, "acked": 3, "failed": 1, "deadLettered": 1}
    assert sum(b["pushed"] for b in analytics["timeSeries"]) == analytics["totals"]["pushed"]
    assert status["queues"] == status_before["queues"]
    assert status["totals"]["pushed"] >= status_before["totals"]["pushed"] + 4
    assert status["messages"]["total"] == status_before["messages"]["total"] + 4
    entry = by(stats["queues"], "name", name)
    assert entry["deadLetters"] == 1
    assert detail["name"] == name
    assert detail["deadLetters"] == 1
    assert detail["messages"]["total"] == 4 and detail["messages"]["pending"] == 0
    assert isinstance(detail["timeSeries"], list)
    assert sum(w["pushed"] for w in workers["workers"]) >= after["pushed"] - before["pushed"]


def test_system_metrics_and_postgres_statistics(url, name):
    async def body(q):
        await q.queue(name).push(items(1))
        system = await q.admin.get_system_metrics()
        pg = await q.admin.get_postgres_stats() if LEGACY else None
        return system, pg

    system, pg = session(url, body)
    assert system["requests"] > 0
    assert system["uptimeSeconds"] > 0
    assert system["database"]["poolMax"] >= system["database"]["poolSize"] > 0
    if LEGACY:
        assert pg["databaseSizeBytes"] > 0
        tables = {t["table"] for t in pg["tables"]}
        assert {"messages", "cursor_states", "dead_letters"} <= tables


def test_consumer_groups_show_lag_and_the_lagging_ones(url, name):
    group, done = name + "-slow", name + "-done"

    async def body(q):
        await q.queue(name).partition("a").push(items(3))
        await q.queue(name).partition("b").push(items(2, 10))
        leased = await pop_builder(q, name, batch=1).partition("a").group(group).pop()
        everything = await pop_builder(q, name, batch=10, partitions=2).group(done).pop()
        await q.ack(everything, True, {"group": done})
        refreshed = await q.admin.refresh_consumer_stats()
        groups = await q.admin.list_consumer_groups()
        detail = await q.admin.get_consumer_group(group)
        lagging = await q.admin.get_lagging_consumers(0)
        not_yet = await q.admin.get_lagging_consumers(3600)
        return leased, refreshed, groups, detail, lagging, not_yet

    leased, refreshed, groups, detail, lagging, not_yet = session(url, body)
    assert refreshed["success"] is True
    slow = by(groups, "name", group)
    assert slow["totalLag"] == 5
    queue = by(slow["queues"], "queue", name)
    assert queue["leasedPartitions"] == 1
    assert slow["maxLagSeconds"] >= 0
    assert by(groups, "name", done)["totalLag"] == 0
    assert detail["name"] == group
    parts = {p["partition"]: p for p in by(detail["queues"], "queue", name)["partitions"]}
    assert parts["a"]["leaseId"] == leased[0]["leaseId"]
    assert parts["a"]["head"] == 3
    assert parts["b"]["leaseId"] is None
    mine = [entry for entry in lagging if entry["queue"] == name]
    assert {entry["consumerGroup"] for entry in mine} == {group}
    assert {entry["partition"] for entry in mine} == {"a", "b"}
    assert not [entry for entry in not_yet if entry["queue"] == name]


async def read(q, name, group):
    """What `group` is handed now (up to 10 messages), acknowledged."""
    got = await pop_builder(q, name, batch=10).group(group).pop()
    if got:
        await q.ack(got, True, {"group": group})
    return got


def test_seek_moves_what_a_group_is_handed(url, name):
    group = name + "-g"
    if ON_CITUS:
        seek_is_refused_on_a_cluster(url, name, group)
        return

    async def body(q):
        await q.queue(name).push(items(3))
        first = await read(q, name, group)
        to_start = await q.admin.seek_consumer_group(group, name, {"toStart": True})
        again = await read(q, name, group)
        await q.queue(name).push(items(2, 10))
        to_end = await q.admin.seek_consumer_group(group, name, {"toEnd": True})
        nothing = await pop_builder(q, name, batch=10).group(group).pop()
        await asyncio.sleep(0.05)
        between = datetime.now(timezone.utc).isoformat()
        await asyncio.sleep(0.05)
        await q.queue(name).push(items(1, 20))
        back = await q.admin.seek_consumer_group(group, name, {"timestamp": between})
        later = await pop_builder(q, name, batch=10).group(group).pop()
        return first, to_start, again, to_end, nothing, back, later

    first, to_start, again, to_end, nothing, back, later = session(url, body)
    assert numbers(first) == [0, 1, 2]
    assert to_start["partitionsMoved"] == 1 and to_start["toStart"] is True
    assert numbers(again) == [0, 1, 2]
    assert to_end["partitionsMoved"] == 1 and to_end["lag"] == 0
    assert nothing == []
    assert back["partitionsMoved"] == 1
    assert numbers(later) == [20], "only what came after the timestamp"


def seek_is_refused_on_a_cluster(url, name, group):
    """On Citus every seek is refused and the group goes on from where it stood."""

    async def body(q):
        await q.queue(name).push(items(3))
        first = await read(q, name, group)
        to_start = await refused(q.admin.seek_consumer_group(group, name, {"toStart": True}))
        again = await read(q, name, group)
        await q.queue(name).push(items(2, 10))
        to_end = await refused(q.admin.seek_consumer_group(group, name, {"toEnd": True}))
        rest = await read(q, name, group)
        back = await refused(
            q.admin.seek_consumer_group(
                group, name, {"timestamp": datetime.now(timezone.utc).isoformat()}
            )
        )
        return first, to_start, again, to_end, rest, back, await read(q, name, group)

    first, to_start, again, to_end, rest, back, later = session(url, body)
    assert numbers(first) == [0, 1, 2]
    for answer in (to_start, to_end, back):
        assert_unsupported_on_cluster(answer)
    assert again == [], "not moved to the start"
    assert numbers(rest) == [10, 11], "not moved to the end"
    assert later == []


def test_a_group_deleted_for_a_queue_starts_again(url, name):
    group = name + "-g"

    async def body(q):
        await q.queue(name).push(items(2))
        await read(q, name, group)
        if ON_CITUS:
            deleted = await refused(q.admin.delete_consumer_group_for_queue(group, name, True))
            kept = await q.admin.get_consumer_group(group)
            return deleted, kept, await pop_builder(q, name, batch=10).group(group).pop()
        deleted = await q.admin.delete_consumer_group_for_queue(group, name, True)
        with pytest.raises(Exception) as gone:
            await q.admin.get_consumer_group(group)
        again = await pop_builder(q, name, batch=10).group(group).pop()
        return deleted, gone.value, again

    deleted, gone, again = session(url, body)
    if ON_CITUS:
        assert_unsupported_on_cluster(deleted)
        assert gone["name"] == group, "the group is kept"
        assert again == [], "the group goes on from where it stood"
        return
    assert deleted["success"] is True and deleted["deletedPartitions"] == 1
    assert deleted["metadataDeleted"] is True
    assert status_of(gone) == 404
    assert numbers(again) == [0, 1], "a new reading starts from the beginning"


def test_health_and_metrics(url, http, name):
    async def body(q):
        await q.queue(name).push(items(2))
        return await q.admin.health(), await q.admin.metrics()

    health, metrics = session(url, body)
    # Queen's fields as Queen answers them; Comb adds its release and schema version.
    assert {k: health[k] for k in ("status", "database")} == {"status": "healthy", "database": "connected"}
    assert health["version"] and health["schemaVersion"] >= 20
    # The client parses every answer as JSON and gives None for Prometheus text (its
    # defect, the same against Queen): the route answered 200, or the call would raise.
    assert metrics is None
    # Depths come from one statement under a short timeout; a scrape it missed says so
    # (`comb_queue_stats_success 0`) and the next one is read. Three missed in a row fail.
    for _ in range(3):
        text = http.get("/metrics").text
        if "comb_queue_stats_success 1" in text:
            break
        time.sleep(1)
    assert "comb_queue_stats_success 1" in text
    assert f'comb_queue_depth_messages{{queue="{name}"}} 2' in text


async def while_on(set_mode, get_mode, action):
    """Turns a maintenance mode on, runs `action`, and turns the mode off whatever happened.
    Returns the answers of switching on, reading, `action`, switching off and reading."""
    try:
        on = await set_mode(True)
        seen = await get_mode()
        result = await action()
    finally:
        off = await set_mode(False)
    return on, seen, result, off, await get_mode()


def test_push_maintenance_answers_503_and_stores_nothing(url, name):
    if not LEGACY:
        assert not hasattr(Admin, "set_maintenance_mode")
        return

    async def refused_push(q):
        with pytest.raises(Exception) as refused:
            await q.queue(name).push(items(1, 1))
        return refused.value

    async def body(q):
        await q.queue(name).push(items(1))
        answers = await while_on(
            q.admin.set_maintenance_mode, q.admin.get_maintenance_mode, lambda: refused_push(q)
        )
        await q.queue(name).push(items(1, 2))
        return answers, await pop_builder(q, name, batch=10).pop()

    (on, seen, refused, off, after), got = session(url, body)
    assert on["enabled"] is True and seen["enabled"] is True
    assert status_of(refused) == 503
    assert refused.response.headers.get("retry-after")
    assert off["enabled"] is False and after["enabled"] is False
    assert numbers(got) == [0, 2], "the refused push stored nothing"


def test_pop_maintenance_hands_out_nothing(url, name):
    if not LEGACY:
        assert not hasattr(Admin, "set_pop_maintenance_mode")
        return

    async def body(q):
        await q.queue(name).push(items(2))
        answers = await while_on(
            q.admin.set_pop_maintenance_mode,
            q.admin.get_pop_maintenance_mode,
            lambda: pop_builder(q, name, batch=10).pop(),
        )
        return answers, await pop_builder(q, name, batch=10).pop()

    (on, seen, held, off, after), got = session(url, body)
    assert on["enabled"] is True and seen["enabled"] is True
    assert held == []
    assert off["enabled"] is False and after["enabled"] is False
    assert numbers(got) == [0, 1]


def test_queue_depth_is_a_later_brokers_route(url, name):
    if LEGACY:
        assert not hasattr(Admin, "get_queue_depth")
        return

    async def body(q):
        await q.queue(name).push(items(1))
        with pytest.raises(Exception) as refused:
            await q.admin.get_queue_depth(name)
        return refused.value

    refused = session(url, body)
    # Queen's later brokers' route (watermarks, conflation): not served, as the
    # compatibility page says; the client's docstring names this fallback to get_queue.
    assert status_of(refused) == 404
    assert refused.response.json()["code"] == "route_not_found"
