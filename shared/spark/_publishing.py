"""The producer's link to the queue: the fleet's shard count and a cached publisher."""

from __future__ import annotations

from .._errors import ConfigError
from ..events import QueueEvent, ValidationLimits, decode_event, encode_event
from ..queue import SyncPublisher, connect, read_fleet_meta
from ..settings import resolve_durability
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
        password=config.redis_password,
        socket_timeout=config.redis_socket_timeout,
        sign_version=config.sign_version,
        policy=config.retry_policy,
        # Validated when the config was built; resolved here without re-building its RedisSettings.
        durability=resolve_durability(
            config.redis_durability, config.redis_wait_replicas, config.redis_wait_timeout
        ),
    )


_LIMITS = ValidationLimits()


def check_event(ev: QueueEvent) -> QueueEvent:
    """Return ``ev`` once it passes the checks a fleet with default limits applies on intake.

    A message the fleet would dead-letter is better refused here, loudly, than
    published: a dead-lettered ``TaskFinished`` leaves its job waiting for its
    timeout. (A fleet may configure a stricter dataset pattern or a smaller
    size limit; those are checked there only.)

    Raises:
        InvalidMessage: (a :class:`~shared.BadInput`) with the reason the fleet would give.
    """
    decode_event(encode_event(ev), sig=None, limits=_LIMITS)
    return ev


def publish(config: ProducerConfig, ev: QueueEvent) -> None:
    """Check ``ev`` (:func:`check_event`) and publish it with this process's cached publisher.

    Raises:
        InvalidMessage: the fleet would reject the event.
        TransientError: Redis stayed unreachable for ``config.redis_retry_budget`` seconds.
        ConfigError: unresolved or wrong shard count, bad credentials.
    """
    publisher_for(config).publish(check_event(ev))


__all__ = ["check_event", "publish", "publisher_for", "resolve_shards"]
