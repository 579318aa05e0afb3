"""Queue creation, configuration and deletion with the client's own defaults."""

import pytest

from comb_client import pop_builder, session


def test_create_with_the_clients_defaults(url, name):
    async def body(q):
        return await q.queue(name).create()

    r = session(url, body)
    assert r["configured"] is True
    assert r["queue"] == name
    opts = r["options"]
    # The client sends priority, maxSize, encryptionEnabled… with every queue it creates.
    assert opts["priority"] == 0
    assert opts["leaseTime"] == 300
    assert opts["retryLimit"] == 3
    assert opts["encryptionEnabled"] is False
    assert opts["deadLetterQueue"] is True


def test_configure_with_queens_option_names(url, name):
    async def body(q):
        first = await q.queue(name).config(
            {
                "lease_time": 60,
                "retry_limit": 5,
                "retry_delay": 0,
                "priority": 7,
                "ttl": 0,
                "dead_letter_queue": True,
                "dlq_after_max_retries": True,
                "retention_enabled": True,
                "max_wait_time_seconds": 0,
            }
        ).create()
        # The client sends its defaults again with a later configure; what it sends wins.
        second = await q.queue(name).config({"priority": 2}).create()
        return first, second

    first, second = session(url, body)
    assert first["options"]["leaseTime"] == 60
    assert first["options"]["retryLimit"] == 5
    assert first["options"]["priority"] == 7
    assert first["options"]["dlqAfterMaxRetries"] is True
    assert second["options"]["priority"] == 2
    assert second["options"]["leaseTime"] == 300  # the client resent its default


def test_an_unknown_option_is_refused_by_name(url, name):
    async def body(q):
        with pytest.raises(Exception) as refused:
            await q.queue(name).config({"lease_tiem": 5}).create()
        return str(refused.value)

    error = session(url, body)
    assert "unknown queue option" in error and "leaseTiem" in error


def test_delete_removes_the_queue_and_its_messages(url, name):
    async def body(q):
        await q.queue(name).create()
        await q.queue(name).push([{"data": {"n": 1}}])
        deleted = await q.queue(name).delete()
        after = await pop_builder(q, name).pop()
        with pytest.raises(Exception) as again:
            await q.queue(name).delete()
        return deleted, after, str(again.value)

    deleted, after, again = session(url, body)
    assert deleted == {"deleted": True, "queue": name}
    assert after == []
    assert "does not exist" in again
