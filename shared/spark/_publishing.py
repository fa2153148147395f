"""The producer's link to the queue: the fleet's shard count and a cached publisher."""

from __future__ import annotations

from .._errors import ConfigError
from ..queue import SyncPublisher, connect, read_fleet_meta
from ._config import ProducerConfig
from ._executor_runtime import process_runtime


async def _resolve(config: ProducerConfig) -> int:
    client = connect(config.redis_settings, client_name="commitfleet-spark-driver")
    try:
        meta = await read_fleet_meta(client, config.fleet)
        if meta is None:
            raise ConfigError(
                f"fleet {config.fleet!r} does not exist in Redis yet: start a worker first, "
                "or give ProducerConfig(shards=N)"
            )
        return meta.shards
    finally:
        await client.aclose()


def resolve_shards(config: ProducerConfig) -> ProducerConfig:
    """Return ``config`` with the fleet's shard count filled in (driver side, once per job).

    With ``config.shards`` set, ``config`` is returned as it is: the
    publisher's first publish records the count in Redis if the fleet is new,
    and checks it against the record otherwise.

    Raises:
        ConfigError: the fleet does not exist and no count was given, or the
            recorded count differs from the configured one.
        TransientError: Redis is unreachable.
    """
    if config.shards is not None:
        return config
    shards = process_runtime().run(_resolve(config))
    return config.with_shards(shards)


def publisher_for(config: ProducerConfig) -> SyncPublisher:
    """Return this process's cached synchronous publisher for ``config``'s fleet.

    Raises:
        ConfigError: ``config.shards`` was never resolved.
    """
    if config.shards is None:
        raise ConfigError("the shard count must be resolved before publishing (resolve_shards)")
    return SyncPublisher.cached(
        config.redis_url,
        config.fleet,
        config.shards,
        config.hmac_secret,
        socket_timeout=config.redis_socket_timeout,
    )


__all__ = ["publisher_for", "resolve_shards"]
