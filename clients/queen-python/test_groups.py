"""Consumer groups: fan-out and every subscription mode."""

import pytest

from comb_client import pop_builder, session


def test_every_group_gets_every_message(url, name):
    async def body(q):
        await q.queue(name).push([{"data": {"n": i}} for i in range(3)])
        out = {}
        for group in ("billing", "audit"):
            got = await pop_builder(q, name, batch=10).group(group).pop()
            acked = await q.ack(got, True, {"group": group})
            out[group] = ([m["data"]["n"] for m in got], acked["success"], got[0]["consumerGroup"])
        return out

    out = session(url, body)
    assert out["billing"] == ([0, 1, 2], True, "billing")
    assert out["audit"] == ([0, 1, 2], True, "audit")


@pytest.mark.parametrize(
    "mode,sees_old",
    [("all", True), ("from_beginning", True), ("new", False), ("new-only", False)],
)
def test_subscription_modes(url, name, mode, sees_old):
    async def body(q):
        await q.queue(name).push({"data": "old"})
        group = "g-" + mode
        first = await pop_builder(q, name, batch=10).group(group).subscription_mode(mode).pop()
        await q.ack(first, True, {"group": group})
        await q.queue(name).push({"data": "new"})
        second = await pop_builder(q, name, batch=10).group(group).subscription_mode(mode).pop()
        return [m["data"] for m in first], [m["data"] for m in second]

    first, second = session(url, body)
    if sees_old:
        assert first == ["old"] and second == ["new"]
    else:
        assert first == [] and second == ["new"]


def test_subscription_from_now(url, name):
    async def body(q):
        await q.queue(name).push({"data": "old"})
        first = await pop_builder(q, name).group("late").subscription_from("now").pop()
        await q.queue(name).push({"data": "new"})
        second = await pop_builder(q, name).group("late").pop()
        return first, [m["data"] for m in second]

    first, second = session(url, body)
    assert first == []
    assert second == ["new"]
