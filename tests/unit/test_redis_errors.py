"""``redis_errors`` and ``shared._redis_py``: what crosses from redis-py into our exception tree."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.exceptions as rx

from shared import ConfigError, TransientError
from shared._redis_py import CAUGHT, is_redis_failure, raised_in_redis_py
from shared.queue import redis_errors
from tests._support.ports import free_port


async def test_redis_py_tripping_over_a_closed_connection_is_transient() -> None:
    # What a cluster failover produced: redis-py writing to a connection whose writer it had dropped.
    conn = redis.asyncio.connection.Connection()
    with pytest.raises(TransientError, match="lost its connection during send"), redis_errors("send"):
        await conn._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])


def test_a_command_an_acl_denies_inside_a_script_is_a_config_error() -> None:
    # Redis 7's reply when a script's redis.call runs a command the caller's ACL denies (seen when
    # the worker rule lacked +hlen): a plain error, not NOPERM; a crash of the worker before.
    text = (
        "The user executing the script can't run this command or subcommand script: a775, on @user_script:49."
    )
    with (
        pytest.raises(ConfigError, match="redis ACL denies save shard state"),
        redis_errors("save shard state"),
    ):
        raise rx.ResponseError(text)


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


def _slot_lookup_in_redis_py() -> None:
    """Raise the KeyError redis-py's cluster client raises for a slot missing from its slot map
    (empty until the client first connects, or while it is being rebuilt)."""
    cluster = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=free_port())
    cluster.nodes_manager.get_node_from_slot(0)


def _our_lookup() -> None:
    raise KeyError("ours")


def _classified(raiser: Callable[[], None]) -> bool:
    """What a best-effort caller decides: catch CAUGHT, then ask is_redis_failure."""
    try:
        raiser()
    except CAUGHT as exc:
        return is_redis_failure(exc)
    raise AssertionError("nothing raised")


def test_a_lookup_error_is_a_redis_failure_only_when_raised_inside_redis_py() -> None:
    with pytest.raises(KeyError) as raised:
        _slot_lookup_in_redis_py()
    assert raised_in_redis_py(raised.value)
    assert _classified(_slot_lookup_in_redis_py)
    assert not _classified(_our_lookup)
    assert not _classified(lambda: [][0])  # an IndexError in our code


def test_redis_errors_makes_redis_py_s_lookup_error_transient_and_lets_ours_through() -> None:
    with pytest.raises(TransientError, match="slot map is changing during route"), redis_errors("route"):
        _slot_lookup_in_redis_py()
    with pytest.raises(KeyError, match="ours"), redis_errors("route"):
        _our_lookup()


class _SlotMapEmpty:
    """A client whose PUBLISH trips over redis-py's cluster slot map (KeyError inside redis-py)."""

    async def publish(self, channel: str, message: bytes) -> int:
        _slot_lookup_in_redis_py()
        return 0


class _BuggyLookup:
    async def publish(self, channel: str, message: bytes) -> int:
        _our_lookup()
        return 0


async def test_a_release_notice_lost_to_the_slot_map_is_logged_and_our_lookup_error_raised() -> None:
    from shared.locks import RedisReleaseNotifier

    await RedisReleaseNotifier(_SlotMapEmpty(), "f").released("ds")  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="ours"):
        await RedisReleaseNotifier(_BuggyLookup(), "f").released("ds")  # type: ignore[arg-type]
