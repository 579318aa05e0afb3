"""Queen's streams SDK (queen.streams, unmodified) against Comb's /streams/v1 routes: pipelines
run by the SDK's own runner, checked against their input through the sink queue."""

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid

from queen.streams import Stream
from queen.streams.helpers import token_bucket_gate

from comb_client import TOKEN, session
import streams_worker


async def drain(queen, queue, until, timeout=30.0):
    """Pops `queue` (a group of its own) and acks, until `until(messages)` holds or `timeout`
    seconds pass; returns every message popped, in order."""
    group = "drain-" + uuid.uuid4().hex[:8]
    out = []
    deadline = time.monotonic() + timeout
    while not until(out) and time.monotonic() < deadline:
        got = await queen.queue(queue).group(group).batch(50).wait(True).timeout_millis(500).pop()
        if got:
            out.extend(got)
            await queen.ack(got, True, {"group": group})
    return out, group


async def more(queen, queue, group, seconds):
    """What reaches `queue` for `group` within `seconds` more (nothing, when exact)."""
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = await queen.queue(queue).group(group).batch(50).wait(True).timeout_millis(300).pop()
        if got:
            out.extend(got)
            await queen.ack(got, True, {"group": group})
    return out


def counted(m):
    """Counts a message into its window, the closer excepted."""
    return 0 if m.get("closer") else 1


async def closer(queen, queue, partitions, after=1.1):
    """A message in a later window of each partition: the runner's clock is the newest message
    it has seen, so this closes every earlier window in a cycle of its own (windows emitted
    only by the partition's cycles, which its lease orders, never by a timer beside them).
    It counts for nothing and its own window stays open."""
    await asyncio.sleep(after)
    for p in partitions:
        await queen.queue(queue).partition(p).push([{"data": {"closer": True}}])


def run(stream, url, query, **kw):
    return stream.run(query_id=query, url=url, bearer_token=TOKEN, reset=True, **kw)


def total(messages, field):
    return sum(m["data"].get(field, 0) for m in messages)


def test_a_stateless_map_and_filter_fill_the_sink_once(url, name):
    src, sink, query = name, name + "-sink", name + "-q"

    async def body(q):
        await q.queue(src).create()
        await q.queue(sink).create()
        for p in ("a", "b"):
            await q.queue(src).partition(p).push([{"data": {"n": i, "p": p}} for i in range(10)])
        runner = await run(
            Stream.from_(q.queue(src))
            # Before a window, operators see Queen's message (its payload under `data`).
            .filter(lambda m: m["data"]["n"] % 2 == 0)
            .map(lambda m: {"n": m["data"]["n"], "p": m["data"]["p"], "square": m["data"]["n"] ** 2})
            .to(q.queue(sink)),
            url, query, batch_size=4,
        )
        out, group = await drain(q, sink, lambda o: len(o) >= 10)
        extra = await more(q, sink, group, 1.0)
        await runner.stop()
        left = await q.queue(src).group("streams." + query).batch(50).wait(False).pop()
        return out, extra, runner.metrics(), left

    out, extra, metrics, left = session(url, body)
    got = sorted((m["data"]["p"], m["data"]["n"], m["data"]["square"]) for m in out)
    assert got == sorted((p, n, n * n) for p in ("a", "b") for n in range(0, 10, 2))
    assert extra == [], "each message reached the sink once"
    assert left == [], "every source message was acked"
    assert metrics["errorsTotal"] == 0, metrics
    # Per partition, the sink keeps the source's order.
    for p in ("a", "b"):
        assert [m["data"]["n"] for m in out if m["data"]["p"] == p] == [0, 2, 4, 6, 8]


def test_a_per_key_tumbling_window_sums_exactly_what_was_pushed(url, http, name):
    src, sink, query = name, name + "-sink", name + "-q"
    pushed = {}

    async def body(q):
        await q.queue(src).create()
        await q.queue(sink).create()
        runner = await run(
            Stream.from_(q.queue(src))
            .key_by(lambda m: m["data"].get("customer", "-"))
            # Windows close when a later message arrives (no idle flush: see `closer`).
            .window_tumbling(seconds=1, idle_flush_ms=0)
            .aggregate({"count": counted, "sum": lambda m: m.get("amount", 0)})
            .map(lambda agg, ctx: {"customer": ctx["key"], "start": ctx["windowStart"], **agg})
            .to(q.queue(sink)),
            url, query, batch_size=20,
        )
        for round_ in range(4):
            for p, customers in (("p1", ("ann", "bob")), ("p2", ("cy",))):
                items = []
                for c in customers:
                    amount = round_ * 10 + len(c)
                    pushed[c] = pushed.get(c, 0) + amount
                    items.append({"data": {"customer": c, "amount": amount}})
                await q.queue(src).partition(p).push(items)
            await asyncio.sleep(0.4)
        await closer(q, src, ("p1", "p2"))
        out, group = await drain(q, sink, lambda o: total(o, "count") >= 12)
        extra = await more(q, sink, group, 1.0)
        await runner.stop()
        return out, extra, runner.metrics()

    out, extra, metrics = session(url, body)
    sums = {}
    for m in out:
        sums[m["data"]["customer"]] = sums.get(m["data"]["customer"], 0) + m["data"]["sum"]
        assert m["data"]["start"] % 1000 == 0, m["data"]
    assert sums == pushed
    assert total(out, "count") == 12
    assert extra == [], "no window was emitted twice"
    assert metrics["errorsTotal"] == 0, metrics
    # The query and its partitions are listed, their state held as rows.
    listed = http.get("/api/v1/streams/queries").json()["queries"]
    mine = [x for x in listed if x["name"] == query]
    assert len(mine) == 1 and mine[0]["sourceQueue"] == src and mine[0]["sinkQueue"] == sink
    assert sorted(p["partition"] for p in mine[0]["partitions"]) == ["p1", "p2"]


def test_sliding_windows_count_each_message_in_every_window_it_falls_in(url, name):
    src, sink, query = name, name + "-sink", name + "-q"

    async def body(q):
        await q.queue(src).create()
        await q.queue(sink).create()
        runner = await run(
            Stream.from_(q.queue(src))
            .window_sliding(size=2, slide=1, idle_flush_ms=0)
            .aggregate({"count": counted, "sum": lambda m: m.get("v", 0)})
            .to(q.queue(sink)),
            url, query, batch_size=20,
        )
        for v in range(1, 7):
            await q.queue(src).partition("p").push([{"data": {"v": v}}])
            await asyncio.sleep(0.3)
        await closer(q, src, ("p",), after=2.1)
        # size / slide = 2: every message is in exactly two windows.
        out, group = await drain(q, sink, lambda o: total(o, "count") >= 12)
        extra = await more(q, sink, group, 2.0)
        await runner.stop()
        return out, extra

    out, extra = session(url, body)
    assert total(out, "count") == 12
    assert total(out, "sum") == 2 * sum(range(1, 7))
    assert extra == []


def test_a_session_window_closes_after_the_gap(url, name):
    src, sink, query = name, name + "-sink", name + "-q"

    async def body(q):
        await q.queue(src).create()
        await q.queue(sink).create()
        runner = await run(
            Stream.from_(q.queue(src))
            .window_session(gap=1, idle_flush_ms=0)
            .aggregate({"count": counted, "sum": lambda m: m.get("v", 0)})
            .to(q.queue(sink)),
            url, query, batch_size=20,
        )
        for v in (1, 2, 3):
            await q.queue(src).partition("u").push([{"data": {"v": v}}])
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.5)
        for v in (10, 20):
            await q.queue(src).partition("u").push([{"data": {"v": v}}])
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.5)
        await closer(q, src, ("u",))
        out, group = await drain(q, sink, lambda o: len(o) >= 2)
        extra = await more(q, sink, group, 2.0)
        await runner.stop()
        return out, extra

    out, extra = session(url, body)
    assert [(m["data"]["count"], m["data"]["sum"]) for m in out] == [(3, 6), (2, 30)]
    assert extra == []


def test_a_gate_holds_one_partition_to_its_rate_in_order_while_others_flow(url, name):
    src, sink, query = name, name + "-sink", name + "-q"
    rate = 4

    async def body(q):
        # A short lease: a gated partition's held-back messages come back when it ends.
        await q.queue(src).config({"lease_time": 1, "retry_limit": 0}).create()
        await q.queue(sink).create()
        await q.queue(src).partition("slow").push([{"data": {"n": i, "lane": "slow"}} for i in range(12)])
        await q.queue(src).partition("fast").push([{"data": {"n": i, "lane": "fast"}} for i in range(10)])
        runner = await run(
            Stream.from_(q.queue(src))
            .gate(token_bucket_gate(
                capacity=rate, refill_per_sec=rate,
                cost_fn=lambda m: 1 if m["lane"] == "slow" else 0,
            ))
            .to(q.queue(sink)),
            url, query, batch_size=50,
        )
        out, group = await drain(q, sink, lambda o: len(o) >= 22, timeout=40)
        extra = await more(q, sink, group, 1.0)
        await runner.stop()
        dead = await q.queue(src).dlq("streams." + query).get()
        return out, extra, dead

    out, extra, dead = session(url, body)
    slow = [m for m in out if m["data"]["lane"] == "slow"]
    fast = [m for m in out if m["data"]["lane"] == "fast"]
    assert [m["data"]["n"] for m in slow] == list(range(12)), "FIFO kept through the gate"
    assert [m["data"]["n"] for m in fast] == list(range(10))
    assert extra == []
    assert dead["total"] == 0, "held-back messages spend no attempts"
    # The other partition is not held back: it is through before the slow one is.
    assert out.index(fast[-1]) < out.index(slow[-1])
    # The bucket lets `rate` through at once and `rate` a second after: the twelfth slow
    # message cannot have been emitted less than (12 - rate) / rate seconds after the first.
    first, last = (m["createdAt"] for m in (slow[0], slow[-1]))
    from datetime import datetime

    span = datetime.fromisoformat(last.replace("Z", "+00:00")) - datetime.fromisoformat(
        first.replace("Z", "+00:00")
    )
    assert span.total_seconds() >= (12 - rate) / rate - 0.05, span


def test_a_cron_window_counts_per_second(url, name):
    src, sink, query = name, name + "-sink", name + "-q"

    async def body(q):
        await q.queue(src).create()
        await q.queue(sink).create()
        runner = await run(
            Stream.from_(q.queue(src))
            # Closed by the runner's idle flush (a cycle without an ack) once a second's window
            # is past its grace period; the grace keeps flushes clear of cycles still
            # processing that second's messages.
            .window_cron(every="second", grace_period=3, idle_flush_ms=300)
            .aggregate({"count": lambda m: 1})
            .map(lambda agg, ctx: {"start": ctx["windowStart"], "end": ctx["windowEnd"], **agg})
            .to(q.queue(sink)),
            url, query, batch_size=20,
        )
        for _ in range(6):
            await q.queue(src).partition("p").push([{"data": {"v": 1}}])
            await asyncio.sleep(0.45)
        out, group = await drain(q, sink, lambda o: total(o, "count") >= 6, timeout=40)
        extra = await more(q, sink, group, 2.0)
        await runner.stop()
        return out, extra

    out, extra = session(url, body)
    assert total(out, "count") == 6
    assert len(out) >= 2, "six messages over more than two seconds span several windows"
    for m in out:
        start, end = m["data"]["start"], m["data"]["end"]
        assert start % 1000 == 0 and end - start == 1000, m["data"]
    assert extra == []


def test_a_runner_killed_between_cycles_resumes_without_losing_or_counting_twice(url, name):
    src, sink, query = name, name + "-sink", name + "-q"
    worker = [sys.executable, streams_worker.__file__, url, src, sink, query]

    async def setup(q):
        # Leases of the killed runner end soon, so its last batch comes back to the next.
        await q.queue(src).config({"lease_time": 2}).create()
        await q.queue(sink).create()
        await q.queue(src).partition("p").push([{"data": {"v": v}} for v in range(1, 31)])

    session(url, setup)
    first = subprocess.Popen(worker, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    # A runner that never reports its cycles is killed, so the test fails instead of waiting.
    give_up = threading.Timer(60, first.kill)
    give_up.start()
    try:
        # Killed once it has committed a few cycles: the rest of its work is cut off.
        for _ in range(3):
            assert first.stdout.readline().strip() == "cycle"
    finally:
        give_up.cancel()
        first.kill()
        first.wait()

    async def resume(q):
        await q.queue(src).partition("p").push([{"data": {"v": v}} for v in range(31, 41)])
        await closer(q, src, ("p",))
        runner = await streams_worker.pipeline(q, src, sink).run(
            query_id=query, url=url, batch_size=3, bearer_token=TOKEN
        )
        out, group = await drain(q, sink, lambda o: total(o, "count") >= 40, timeout=40)
        extra = await more(q, sink, group, 2.0)
        await runner.stop()
        return out, extra

    out, extra = session(url, resume)
    assert total(out, "count") == 40
    assert total(out, "sum") == sum(range(1, 41))
    assert extra == []


def windows_of(events, size_ms, slide_ms):
    """The windows `events` ((ts, amount) pairs) fall in, window start -> (count, sum): every
    window of `size_ms` starting at a multiple of `slide_ms` that holds the event."""
    out = {}
    for ts, amount in events:
        start = ts - ts % slide_ms
        while start > ts - size_ms:
            count, total_ = out.get(start, (0, 0))
            out[start] = (count + 1, total_ + amount)
            start -= slide_ms
    return out


def test_every_window_is_emitted_once_with_its_exact_count_and_sum_under_idle_flush_and_late_events(
    url, name
):
    """Event times from the payload, so the windows are known in advance: a 2 s tumbling
    window and a 4 s window sliding by 2 s, each with an idle flush of 800 ms closing ripe
    windows beside the runner's leased cycles while events keep arriving 1.1 s apart; then a
    closer far ahead (counted nowhere: its own window stays open) and an event far behind the
    watermark, which both drop. Every emitted window is compared with the expected one: each
    once, with its count and its sum."""
    src, query = name, name + "-q"
    kinds = {"tumbling": (2000, 2000), "sliding": (4000, 2000)}

    async def body(q):
        await q.queue(src).create()
        runners = []
        for kind, (size, slide) in kinds.items():
            await q.queue(src + "-" + kind).create()
            window = (
                Stream.from_(q.queue(src)).window_tumbling(
                    seconds=size / 1000, idle_flush_ms=800, event_time=lambda m: m["data"]["ts"]
                )
                if kind == "tumbling"
                else Stream.from_(q.queue(src)).window_sliding(
                    size=size / 1000,
                    slide=slide / 1000,
                    idle_flush_ms=800,
                    event_time=lambda m: m["data"]["ts"],
                )
            )
            runners.append(
                await run(
                    window.aggregate({"count": counted, "sum": lambda m: m.get("amount", 0)})
                    .map(lambda agg, ctx: {"start": ctx["windowStart"], **agg})
                    .to(q.queue(src + "-" + kind)),
                    url, query + "-" + kind, batch_size=20,
                )
            )
        events = []
        base = int(time.time() * 1000)
        for amount in range(1, 9):
            ts = base + (amount - 1) * 1100
            events.append((ts, amount))
            await q.queue(src).partition("p").push([{"data": {"ts": ts, "amount": amount}}])
            await asyncio.sleep(1.1)
        # Ahead: closes every window of the events. Far behind the watermark: late, dropped.
        await q.queue(src).partition("p").push([{"data": {"ts": base + 60_000, "closer": True}}])
        await q.queue(src).partition("p").push([{"data": {"ts": base - 10_000, "amount": 100}}])
        emitted = {}
        for kind, (size, slide) in kinds.items():
            want = windows_of(events, size, slide)
            out, group = await drain(
                q, src + "-" + kind, lambda o: total(o, "count") >= sum(c for c, _ in want.values())
            )
            out.extend(await more(q, src + "-" + kind, group, 2.0))
            emitted[kind] = [(m["data"]["start"], m["data"]["count"], m["data"]["sum"]) for m in out]
        for r in runners:
            await r.stop()
        return events, emitted

    events, emitted = session(url, body)
    for kind, (size, slide) in kinds.items():
        want = windows_of(events, size, slide)
        got = emitted[kind]
        starts = [start for start, _, _ in got]
        assert len(starts) == len(set(starts)), f"{kind}: a window emitted twice: {got}"
        assert {s: (c, t) for s, c, t in got} == want, f"{kind}: {got} against {want}"


def emitted_by_partition(messages):
    """Sink messages carrying their window's source partition: partition -> [(start, count,
    sum)]."""
    out = {}
    for m in messages:
        d = m["data"]
        out.setdefault(d["partition"], []).append((d["start"], d["count"], d["sum"]))
    return out


def assert_windows(got, want, what):
    """Each window emitted once, with its exact count and sum."""
    starts = [start for start, _, _ in got]
    assert len(starts) == len(set(starts)), f"{what}: a window emitted twice: {sorted(got)}"
    assert {s: (c, t) for s, c, t in got} == want, f"{what}: {sorted(got)} against {want}"


def windowed(q, src, sink, window, key_by=None):
    """`window` of `src` counted and summed into `sink`, each emission naming its window's
    start and source partition."""
    stream = Stream.from_(q.queue(src))
    if key_by:
        stream = stream.key_by(key_by)
    return (
        window(stream)
        .aggregate({"count": counted, "sum": lambda m: m.get("amount", 0)})
        .map(lambda agg, ctx: {"partition": ctx["partition"], "start": ctx["windowStart"], **agg})
        .to(q.queue(sink))
    )


def by_event_time(m):
    return m["data"]["ts"]


def test_5000_events_over_20_partitions_every_partitions_windows_are_exact(url, name):
    """Load: 250 events in each of 20 partitions, in 1 s tumbling windows by event time (20 ms
    apart: about five windows each), with the idle flush closing ripe windows every 300 ms
    beside the leased cycles. Every partition's windows, its count and its sum are exact."""
    src, sink, query = name, name + "-sink", name + "-q"
    parts = [f"p{i:02}" for i in range(20)]
    per = 250

    async def body(q):
        await q.queue(src).create()
        await q.queue(sink).create()
        runner = await run(
            windowed(
                q, src, sink,
                lambda s: s.window_tumbling(seconds=1, idle_flush_ms=300, event_time=by_event_time),
            ),
            url, query, batch_size=100,
        )
        base = int(time.time() * 1000)
        events = {}
        for i, p in enumerate(parts):
            events[p] = [(base + k * 20, i * 1000 + k) for k in range(per)]
            await q.queue(src).partition(p).push(
                [{"data": {"ts": ts, "amount": a}} for ts, a in events[p]]
            )
        # Ahead of every event: closes each partition's windows (its own stays open).
        for p in parts:
            await q.queue(src).partition(p).push([{"data": {"ts": base + 60_000, "closer": True}}])
        out, group = await drain(q, sink, lambda o: total(o, "count") >= len(parts) * per, timeout=120)
        out.extend(await more(q, sink, group, 2.0))
        await runner.stop()
        return events, out

    events, out = session(url, body)
    got = emitted_by_partition(out)
    assert sorted(got) == parts
    for p in parts:
        assert sum(c for _, c, _ in got[p]) == per, p
        assert sum(t for _, _, t in got[p]) == sum(a for _, a in events[p]), p
        assert_windows(got[p], windows_of(events[p], 1000, 1000), p)


def test_each_partitions_windows_count_its_own_six_events_alone(url, name):
    """Three partitions, six events each, pushed in turns, every event under one and the
    same key: each partition's windows (state of the same keys in three partitions) count and
    sum its own events, nothing of the others'."""
    src, sink, query = name, name + "-sink", name + "-q"
    parts = ["a", "b", "c"]

    async def body(q):
        await q.queue(src).create()
        await q.queue(sink).create()
        runner = await run(
            windowed(
                q, src, sink,
                lambda s: s.window_tumbling(seconds=2, idle_flush_ms=200, event_time=by_event_time),
                key_by=lambda m: "same",
            ),
            url, query, batch_size=4,
        )
        base = int(time.time() * 1000)
        events = {p: [] for p in parts}
        for k in range(6):
            for i, p in enumerate(parts):
                ts, amount = base + k * 500, 10 ** i * (k + 1)
                events[p].append((ts, amount))
                await q.queue(src).partition(p).push([{"data": {"ts": ts, "amount": amount}}])
        for p in parts:
            await q.queue(src).partition(p).push([{"data": {"ts": base + 60_000, "closer": True}}])
        out, group = await drain(q, sink, lambda o: total(o, "count") >= 18)
        out.extend(await more(q, sink, group, 2.0))
        await runner.stop()
        return events, out

    events, out = session(url, body)
    got = emitted_by_partition(out)
    assert sorted(got) == parts
    for p in parts:
        assert sum(c for _, c, _ in got[p]) == 6, (p, got[p])
        assert_windows(got[p], windows_of(events[p], 2000, 2000), p)


def test_a_4s_window_sliding_by_2s_over_six_events_a_second_apart_counts_each_window_exactly(
    url, name
):
    """Six events 1 s apart by event time, each in exactly two windows of 4 s sliding by 2 s:
    twelve counted in all, each window its own events, none emitted twice, with the idle
    flush running every 200 ms while the events arrive in cycles of their own."""
    src, sink, query = name, name + "-sink", name + "-q"

    async def body(q):
        await q.queue(src).create()
        await q.queue(sink).create()
        runner = await run(
            windowed(
                q, src, sink,
                lambda s: s.window_sliding(
                    size=4, slide=2, idle_flush_ms=200, event_time=by_event_time
                ),
            ),
            url, query, batch_size=20,
        )
        base = int(time.time() * 1000)
        events = [(base + k * 1000, k + 1) for k in range(6)]
        for ts, amount in events:
            await q.queue(src).partition("p").push([{"data": {"ts": ts, "amount": amount}}])
            await asyncio.sleep(0.15)
        await q.queue(src).partition("p").push([{"data": {"ts": base + 60_000, "closer": True}}])
        out, group = await drain(q, sink, lambda o: total(o, "count") >= 12)
        out.extend(await more(q, sink, group, 2.0))
        await runner.stop()
        return events, out

    events, out = session(url, body)
    assert total(out, "count") == 12
    assert_windows(emitted_by_partition(out)["p"], windows_of(events, 4000, 2000), "sliding")
