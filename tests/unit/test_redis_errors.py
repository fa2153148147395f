"""``redis_errors``: what crosses the boundary from redis-py into our exception tree."""

from __future__ import annotations

import pytest
import redis.asyncio.connection

from shared import TransientError
from shared.queue import redis_errors


async def test_redis_py_tripping_over_a_closed_connection_is_transient() -> None:
    # What a cluster failover produced: redis-py writing to a connection whose writer it had dropped.
    conn = redis.asyncio.connection.Connection()
    with pytest.raises(TransientError, match="lost its connection during send"), redis_errors("send"):
        await conn._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])


def test_our_own_attribute_error_is_a_bug_and_propagates() -> None:
    value: object = None
    with pytest.raises(AttributeError), redis_errors("build args"):
        value.encode()  # type: ignore[attr-defined]


class _ClosedUnder:
    """A client whose PUBLISH hits redis-py's send on a connection dropped under it."""

    async def publish(self, channel: str, message: bytes) -> int:
        await redis.asyncio.connection.Connection()._send_packed_command([b"PUBLISH"])
        return 0


class _Buggy:
    async def publish(self, channel: str, message: bytes) -> int:
        value: object = None
        return value.bit_length()  # type: ignore[attr-defined,no-any-return]


async def test_a_release_notice_lost_to_redis_py_is_logged_not_raised() -> None:
    from shared.locks import RedisReleaseNotifier

    await RedisReleaseNotifier(_ClosedUnder(), "f").released("ds")  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        await RedisReleaseNotifier(_Buggy(), "f").released("ds")  # type: ignore[arg-type]
