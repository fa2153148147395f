"""The fleet's meta record in Redis: its shard count, fixed at creation.

The record is the authority on N. A process whose ``fleet.shards`` is not set
(0, the default) takes the fleet's count from it (a new fleet is created with
:data:`DEFAULT_SHARDS`); an explicit setting that disagrees with the record is
a :class:`~shared.ConfigError`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
import redis.asyncio

from .._errors import ConfigError
from ..settings import Settings
from ._connect import redis_errors
from ._durability import check_durability, probe_keys
from ._keys import Keys

# Record the shard count and creation time if absent; return the recorded count. A script,
# not MULTI/EXEC: one plain command on Redis Cluster too (see shared/fleet/_registry.py).
_ENSURE = """
redis.call('HSETNX', KEYS[1], 'shards', ARGV[1])
redis.call('HSETNX', KEYS[1], 'created_at', ARGV[2])
return redis.call('HGET', KEYS[1], 'shards')
"""

DEFAULT_SHARDS = 64
"""The shard count of a fleet created by a process that does not set ``fleet.shards``."""


@dataclass(frozen=True, slots=True)
class FleetMeta:
    """What Redis records about a fleet."""

    fleet: str
    shards: int
    created_at: float


async def ensure_fleet(redis_client: redis.asyncio.Redis, fleet: str, shards: int) -> int:
    """Record the fleet's shard count on first use, or check it against the record.

    The first caller (worker, coordinator or producer) fixes N for the fleet's
    lifetime (HSETNX, atomic with the read-back in one MULTI/EXEC). With
    ``shards`` 0 (not configured) the recorded count is adopted, and a new
    fleet gets :data:`DEFAULT_SHARDS`.

    Returns:
        The fleet's shard count (equal to ``shards`` when that is not 0).

    Raises:
        ConfigError: ``shards`` is set and the fleet was created with another
            count, or the meta key holds garbage.
        TransientError: Redis is unreachable.

    Cancellation: HSETNX is idempotent, so a cancelled call is simply repeated.
    """
    if shards < 0:
        raise ConfigError(f"fleet {fleet}: shards must be >= 1 (or 0: the fleet's own count), got {shards}")
    key = Keys(fleet).meta
    with redis_errors("ensure_fleet"):
        recorded = await redis_client.eval(_ENSURE, 1, key, str(shards or DEFAULT_SHARDS), repr(time.time()))
    return _checked(fleet, shards, recorded)


def _checked(fleet: str, shards: int, recorded: object) -> int:
    try:
        actual = int(recorded) if isinstance(recorded, (bytes, str, int)) else -1
    except ValueError:
        actual = -1
    if actual < 1:
        raise ConfigError(f"fleet {fleet}: meta record has a bad shard count {recorded!r}")
    if shards and actual != shards:
        raise ConfigError(
            f"fleet {fleet} was created with {actual} shards; this process is configured with {shards} "
            "(fleet.shards): leave fleet.shards unset to use the fleet's own count"
        )
    return actual


def ensure_fleet_sync(redis_client: redis.Redis, fleet: str, shards: int) -> int:
    """Blocking twin of :func:`ensure_fleet` (for producers without an event loop)."""
    if shards < 0:
        raise ConfigError(f"fleet {fleet}: shards must be >= 1 (or 0: the fleet's own count), got {shards}")
    key = Keys(fleet).meta
    with redis_errors("ensure_fleet"):
        recorded: object = redis_client.eval(
            _ENSURE, 1, key, str(shards or DEFAULT_SHARDS), repr(time.time())
        )
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


async def join_fleet(redis_client: redis.asyncio.Redis, settings: Settings) -> Settings:
    """Return ``settings`` with the fleet's shard count; create the fleet when new (workers, coordinators).

    Then check that the server gives ``redis.durability`` (:func:`check_durability`,
    on every master the fleet writes to), so that a level it cannot give stops
    the process here, at start, and not at its first commit. The check's wait
    also covers the fleet record just created (one ordered log per master).

    Raises:
        ConfigError: ``fleet.shards`` is set and disagrees with the fleet's record,
            or the server cannot give ``redis.durability`` (one line saying why).
        TransientError: Redis is unreachable.
    """
    shards = await ensure_fleet(redis_client, settings.fleet.name, settings.fleet.shards)
    joined = settings.with_shards(shards)
    await check_durability(redis_client, joined.redis.durable, probe_keys(Keys(joined.fleet.name), shards))
    return joined


async def existing_fleet(redis_client: redis.asyncio.Redis, settings: Settings) -> Settings:
    """Return ``settings`` with the fleet's shard count, read from its record (never creates it).

    For the operator commands (status, retry, skip): a typo in the fleet name
    must not create a fleet.

    Raises:
        ConfigError: the fleet does not exist and ``fleet.shards`` is not set,
            or ``fleet.shards`` is set and disagrees with the fleet's record.
        TransientError: Redis is unreachable.
    """
    fleet, shards = settings.fleet.name, settings.fleet.shards
    meta = await read_fleet_meta(redis_client, fleet)
    if meta is None:
        if shards:
            return settings
        raise ConfigError(
            f"fleet {fleet} does not exist in Redis (no worker, coordinator or producer has used it): "
            "check fleet.name and redis.url"
        )
    return settings.with_shards(_checked(fleet, shards, meta.shards))


__all__ = [
    "DEFAULT_SHARDS",
    "FleetMeta",
    "ensure_fleet",
    "ensure_fleet_sync",
    "existing_fleet",
    "join_fleet",
    "read_fleet_meta",
]
