"""The fleet's meta record in Redis: its shard count, fixed at creation."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
import redis.asyncio

from .._errors import ConfigError
from ._connect import redis_errors
from ._keys import Keys


@dataclass(frozen=True, slots=True)
class FleetMeta:
    """What Redis records about a fleet."""

    fleet: str
    shards: int
    created_at: float


async def ensure_fleet(redis_client: redis.asyncio.Redis, fleet: str, shards: int) -> int:
    """Record the fleet's shard count on first use, or check it against the record.

    The first caller (worker, coordinator or producer) fixes N for the fleet's
    lifetime (HSETNX, atomic with the read-back in one MULTI/EXEC).

    Returns:
        The fleet's shard count (equal to ``shards``).

    Raises:
        ConfigError: the fleet was created with another shard count, or the
            meta key holds garbage.
        TransientError: Redis is unreachable.

    Cancellation: HSETNX is idempotent, so a cancelled call is simply repeated.
    """
    if shards < 1:
        raise ConfigError(f"fleet {fleet}: shards must be >= 1, got {shards}")
    key = Keys(fleet).meta
    with redis_errors("ensure_fleet"):
        async with redis_client.pipeline(transaction=True) as pipe:
            pipe.hsetnx(key, "shards", str(shards))
            pipe.hsetnx(key, "created_at", repr(time.time()))
            pipe.hget(key, "shards")
            _, _, recorded = await pipe.execute()
    return _checked(fleet, shards, recorded)


def _checked(fleet: str, shards: int, recorded: object) -> int:
    try:
        actual = int(recorded) if isinstance(recorded, (bytes, str, int)) else -1
    except ValueError:
        actual = -1
    if actual < 1:
        raise ConfigError(f"fleet {fleet}: meta record has a bad shard count {recorded!r}")
    if actual != shards:
        raise ConfigError(
            f"fleet {fleet} was created with {actual} shards, this process is configured with {shards}"
        )
    return actual


def ensure_fleet_sync(redis_client: redis.Redis, fleet: str, shards: int) -> int:
    """Blocking twin of :func:`ensure_fleet` (for producers without an event loop)."""
    if shards < 1:
        raise ConfigError(f"fleet {fleet}: shards must be >= 1, got {shards}")
    key = Keys(fleet).meta
    with redis_errors("ensure_fleet"):
        pipe = redis_client.pipeline(transaction=True)
        pipe.hsetnx(key, "shards", str(shards))
        pipe.hsetnx(key, "created_at", repr(time.time()))
        pipe.hget(key, "shards")
        recorded: object = pipe.execute()[2]
    return _checked(fleet, shards, recorded)


async def read_fleet_meta(redis_client: redis.asyncio.Redis, fleet: str) -> FleetMeta | None:
    """Return the fleet's meta record, or None when the fleet does not exist yet.

    Raises:
        ConfigError: the record is malformed.
        TransientError: Redis is unreachable.
    """
    with redis_errors("read_fleet_meta"):
        raw = await redis_client.hgetall(Keys(fleet).meta)
    if not raw:
        return None
    try:
        return FleetMeta(
            fleet=fleet,
            shards=int(raw[b"shards"]),
            created_at=float(raw.get(b"created_at", b"0")),
        )
    except (KeyError, ValueError):
        raise ConfigError(f"fleet {fleet}: malformed meta record {raw!r}") from None


__all__ = ["FleetMeta", "ensure_fleet", "ensure_fleet_sync", "read_fleet_meta"]
