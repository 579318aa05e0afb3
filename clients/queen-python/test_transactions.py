"""Transactions: an ack and a push in one commit."""

import pytest

from comb_client import pop_builder, session


def test_ack_and_push_commit_together(url, name):
    target = name + "-next"

    async def body(q):
        await q.queue(name).push({"data": {"step": 1}})
        got = await pop_builder(q, name).pop()
        result = (
            await q.transaction()
            .ack(got[0])
            .queue(target)
            .push([{"data": {"step": 2}}])
            .commit()
        )
        source_rest = await pop_builder(q, name).pop()
        moved = await pop_builder(q, target).pop()
        return result, source_rest, moved

    result, source_rest, moved = session(url, body)
    assert result["success"] is True
    assert source_rest == []
    assert [m["data"] for m in moved] == [{"step": 2}]


def test_a_transaction_with_a_settled_ack_fails_whole(url, name):
    target = name + "-next"

    async def body(q):
        await q.queue(name).push({"data": {"step": 1}})
        got = await pop_builder(q, name).pop()
        await q.ack(got[0], True)
        with pytest.raises(Exception):
            await q.transaction().ack(got[0]).queue(target).push([{"data": {"step": 2}}]).commit()
        return await pop_builder(q, target).pop()

    assert session(url, body) == []
