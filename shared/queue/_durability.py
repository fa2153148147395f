"""The durability step after the fleet's writes (``WAIT`` / ``WAITAOF``), and its check at start.

``redis.durability`` (:class:`~shared.settings.Durability`) says what a
write the fleet's guarantees rest on waits for once Redis has acknowledged
it: nothing (``memory``), ``n`` replicas (``replicas``: ``WAIT n t``), the
master's fsync of its append-only file (``aof``: ``WAITAOF 1 0 t``) or both
(``aof+replicas``: ``WAITAOF 1 n t``).

Both commands count the writes of their own connection, so the wait goes on
the connection that carried the writes: at the end of the writes' pipeline,
once per node written to on a Redis Cluster (:func:`queue_durable`). For
writes made on another pooled connection, :func:`make_durable` writes one
byte and waits on its own connection: replication and the append-only file
are one ordered log per master, so that covers every write the master
applied before. Fewer acknowledgements than asked within the timeout is a
:class:`~shared.TransientError`: the write stands on the master but is
retried (every such write is idempotent, or a duplicate the contract
allows).

A level the server cannot give stops a process at start with one line
(:func:`check_durability`): fewer connected replicas than asked, where
``INFO replication`` answers; then, everywhere, the command itself after a
one-byte write (on managed Redis without ``CONFIG`` or ``INFO`` that is the
only way to know). ``CONFIG GET append*`` is sent only once the check has
failed, to say why (a refused ``CONFIG`` is ignored): a fleet that runs never
sends ``CONFIG``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis
import redis.asyncio
import redis.exceptions as rx

from .._errors import ConfigError, TransientError
from .._logging import kv
from ..settings import Durability
from ._cluster import is_cluster
from ._connect import redis_errors
from ._keys import Keys
from ._sentinel import rediscover

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
"""The start-up check waits at least this long for its acknowledgements (a new replica's first
``WAITAOF`` acknowledgement took 3 s in the tests), however short ``redis.wait_timeout`` is."""


def queue_durable(client: Any, pipe: Any, keys: Iterable[str], durability: Durability) -> int:
    """Append the level's ``WAIT`` / ``WAITAOF`` to a non-transactional pipeline, once per node written to.

    ``keys`` are the keys the pipeline writes. On one node that is one
    command at the end; on a cluster one per master owning any of the keys,
    routed to that master, so it runs on the connection that carried the
    writes. Returns how many such replies the pipeline's result ends with
    (0 for ``memory``). An async cluster client must have read its slot map
    (``await client.initialize()``) before this is called.

    Raises:
        TransientError: (cluster) no master is known for a key.
    """
    if not durability.waits:
        return 0
    command = durability.command()
    if not is_cluster(client):
        pipe.execute_command(*command)
        return 1
    nodes = {}
    for key in keys:
        node = client.get_node_from_key(key)
        if node is None:
            raise TransientError(f"redis cluster: no master known for {key!r} (slot map not loaded)")
        nodes[node.name] = node
    for node in nodes.values():
        pipe.execute_command(*command, target_nodes=node)
    return len(nodes)


def _shortfall(reply: Any, durability: Durability) -> str | None:
    """Return why one ``WAIT`` / ``WAITAOF`` reply falls short of ``durability``, or None when it does not."""
    if durability.aof:
        local, replicas = (int(x) for x in reply)
        if local < 1:
            return f"the master did not fsync the writes to its append-only file in {durability.timeout} s"
        if replicas < durability.replicas:
            return (
                f"only {replicas} of {durability.replicas} replicas fsynced the writes to their "
                f"append-only files in {durability.timeout} s"
            )
        return None
    acks = int(reply)
    if acks < durability.replicas:
        return (
            f"only {acks} of {durability.replicas} replicas acknowledged the writes in {durability.timeout} s"
        )
    return None


def check_durable(
    replies: list[Any], waits: int, durability: Durability, *, client: object = None
) -> list[Any]:
    """Return ``replies`` without their last ``waits`` replies (the waits), after checking them.

    ``client`` is the client that ran them: on a shortfall, a Sentinel client
    is made to ask the Sentinels for the master before its next command
    (:func:`~shared.queue._sentinel.rediscover`): a master that lost its
    replicas may have been replaced while it still answers.

    Raises:
        TransientError: a wait saw fewer acknowledgements than the level asks
            for (the writes exist on their master but may be lost in a
            failover or a power cut: the caller sends them again).
    """
    if waits == 0:
        return replies
    body, acks = replies[:-waits], replies[-waits:]
    for reply in acks:
        why = _shortfall(reply, durability)
        if why is not None:
            rediscover(client)
            raise TransientError(f"durability {durability.describe()}: {why}")
    return body


async def make_durable(client: redis.asyncio.Redis, key: str, durability: Durability) -> None:
    """Wait until every write made so far to the master serving ``key`` is as durable as the level asks.

    For writes made on another pooled connection (a script or transaction
    that has already returned): one write (``SET key 1``, ``key`` a small
    marker in the written slot) then the wait on its connection covers
    everything the master applied before, since replication and the
    append-only file are one ordered log per master. Nothing for ``memory``.

    Raises:
        TransientError: fewer acknowledgements within the level's timeout (the
            writes stand on the master; the caller may write again, idempotently),
            or Redis unavailable.
        ConfigError: the server no longer gives the level (WAITAOF refused).
    """
    if not durability.waits:
        return
    with redis_errors("make writes durable"):
        if is_cluster(client):
            await client.initialize()
        async with client.pipeline(transaction=False) as pipe:
            pipe.set(key, b"1")
            waits = queue_durable(client, pipe, [key], durability)
            replies = list(await pipe.execute())
    check_durable(replies, waits, durability, client=client)


def probe_keys(keys: Keys, shards: int) -> list[str]:
    """Return the one-byte marker keys the start-up check may write: the fleet slot's, then each shard's.

    Every master the fleet writes to serves one of them (on a cluster), and
    they are the markers :func:`make_durable` already writes.
    """
    return [keys.fleet_key("wait"), *(keys.shard_state(s, "wait") for s in range(max(shards, 1)))]


def _one_per_node(client: Any, keys: Sequence[str]) -> list[str]:
    if not is_cluster(client):
        return list(keys[:1])
    seen: dict[str, str] = {}
    for key in keys:
        node = client.get_node_from_key(key)
        if node is None:
            raise TransientError(f"redis cluster: no master known for {key!r} (slot map not loaded)")
        seen.setdefault(node.name, key)
    return list(seen.values())


def _text(value: object) -> str:
    return (value.decode(errors="replace") if isinstance(value, bytes) else str(value)).strip()


def _facts(info_server: object, info_repl: object, config: object) -> dict[str, str]:
    """Return what the ``INFO server``, ``INFO replication`` and ``CONFIG GET`` replies say (where given)."""
    facts: dict[str, str] = {}
    for reply in (info_server, info_repl):
        if isinstance(reply, dict):
            for name in ("redis_version", "valkey_version", "connected_slaves", "role"):
                if name in reply:
                    facts[name] = _text(reply[name])
    if isinstance(config, dict):
        for name, value in config.items():
            facts[_text(name)] = _text(value)
    return facts


def _server(facts: dict[str, str]) -> str:
    if "valkey_version" in facts:
        return f"Valkey {facts['valkey_version']}"
    if "redis_version" in facts:
        return f"Redis {facts['redis_version']}"
    return "this server"


def refusal(durability: Durability, reply: object, facts: dict[str, str]) -> str | None:
    """Return the one line refusing ``durability`` given the check's wait ``reply``; None when it holds.

    ``reply`` is what the check's ``WAIT`` / ``WAITAOF`` answered (a reply or a
    redis-py error); ``facts`` what ``INFO`` / ``CONFIG`` said, where they answered.
    """
    level = f'redis.durability = "{durability.level}"'
    command = str(durability.command()[0])
    if isinstance(reply, rx.NoPermissionError):
        return f"{level} needs {command}, which the redis ACL denies this user: {_text(reply)}"
    if isinstance(reply, rx.ResponseError):
        text = _text(reply)
        if "unknown command" in text.lower():
            return (
                f"{level} needs {command}, which {_server(facts)} does not know "
                f"(WAITAOF came with Redis 7.2 and Valkey 7.2): {text}"
            )
        if "appendonly" in text.lower():
            return f"{level} needs the master's append-only file (appendonly yes): Redis answered: {text}"
        return f"{level}: {command} failed: {text}"
    if isinstance(reply, BaseException):
        return f"{level}: {command} failed: {reply!r}"
    why = _shortfall(reply, durability)
    if why is None:
        return None
    known = []
    if "connected_slaves" in facts:
        known.append(f"{facts['connected_slaves']} replicas connected to the master")
    if durability.aof and "appendfsync" in facts:
        known.append(f"appendfsync {facts['appendfsync']}")
    if durability.level == "aof+replicas":
        known.append("a replica without appendonly yes never acknowledges WAITAOF")
    detail = f" ({'; '.join(known)})" if known else ""
    return f"{level} cannot be given: {why}{detail}"


def _too_few_connected(durability: Durability, facts: dict[str, str]) -> None:
    """Refuse at once when ``INFO replication`` (where it answers) counts fewer replicas than asked."""
    connected = facts.get("connected_slaves", "")
    if durability.replicas and connected.isdigit() and int(connected) < durability.replicas:
        raise ConfigError(
            f'redis.durability = "{durability.level}" waits for {durability.replicas} replicas, '
            f"but {connected} are connected to the master ({_server(facts)}, INFO replication)"
        )


def _probe(durability: Durability) -> Durability:
    return Durability(durability.level, durability.replicas, max(durability.timeout, PROBE_TIMEOUT_S))


def _note_slow(durability: Durability, elapsed: float) -> None:
    if elapsed > durability.timeout:
        log.warning(
            "the durability check waited longer than redis.wait_timeout: durable writes will time out "
            "and be retried; raise redis.wait_timeout",
            extra=kv(
                durability=durability.describe(), took=round(elapsed, 3), wait_timeout=durability.timeout
            ),
        )


async def _facts_async(client: redis.asyncio.Redis, *, config: bool = False) -> dict[str, str]:
    """Return what ``INFO`` (and, with ``config``, ``CONFIG GET append*``) say; {} on a cluster."""
    if is_cluster(client):
        return {}
    replies: list[object] = []
    calls: list[Any] = [lambda: client.info("server"), lambda: client.info("replication")]
    calls.append((lambda: client.config_get("append*")) if config else None)
    for call in calls:
        try:
            replies.append(None if call is None else await call())
        except rx.RedisError:
            replies.append(None)  # managed Redis may refuse INFO or CONFIG: the check needs neither
    return _facts(*replies)


async def check_durability(client: redis.asyncio.Redis, durability: Durability, keys: Sequence[str]) -> None:
    """Check at start that the server gives ``durability``: a one-byte write and the level's wait, per master.

    ``keys`` are marker keys the caller may write (:func:`probe_keys`); the
    check writes one on each master serving any of them. It waits at least
    :data:`PROBE_TIMEOUT_S` for the acknowledgements, and logs a warning when
    they took longer than ``redis.wait_timeout``. Nothing for ``memory``.

    Raises:
        ConfigError: the server cannot give the level (one line: no WAITAOF
            before Redis 7.2, appendonly off, fewer replicas than asked, the
            ACL denies the command).
        TransientError: Redis is unreachable (the caller waits and tries again).
    """
    if not durability.waits:
        return
    probe = _probe(durability)
    with redis_errors("check redis.durability"):
        if is_cluster(client):
            await client.initialize()
        facts = await _facts_async(client)
        _too_few_connected(durability, facts)
        targets = _one_per_node(client, keys)
        started = time.monotonic()
        async with client.pipeline(transaction=False) as pipe:
            for key in targets:
                pipe.set(key, b"1")
            waits = queue_durable(client, pipe, targets, probe)
            replies = list(await pipe.execute(raise_on_error=False))
        elapsed = time.monotonic() - started
        for reply in replies[:-waits]:
            if isinstance(reply, BaseException):
                raise reply  # the one-byte write itself failed: READONLY, NOPERM, ... (translated)
        for reply in replies[-waits:]:
            if refusal(durability, reply, {}) is not None:
                facts |= await _facts_async(client, config=True)  # only now: CONFIG helps say why
                raise ConfigError(refusal(probe, reply, facts))
    _note_slow(durability, elapsed)


def check_durability_sync(client: redis.Redis, durability: Durability, keys: Sequence[str]) -> None:
    """Blocking twin of :func:`check_durability` (the Spark producer's first publish)."""
    if not durability.waits:
        return
    probe = _probe(durability)
    with redis_errors("check redis.durability"):
        facts = _facts_sync(client)
        _too_few_connected(durability, facts)
        targets = _one_per_node(client, keys)
        started = time.monotonic()
        pipe = client.pipeline(transaction=False)
        for key in targets:
            pipe.set(key, b"1")
        waits = queue_durable(client, pipe, targets, probe)
        replies = list(pipe.execute(raise_on_error=False))
        elapsed = time.monotonic() - started
        for reply in replies[:-waits]:
            if isinstance(reply, BaseException):
                raise reply
        for reply in replies[-waits:]:
            if refusal(durability, reply, {}) is not None:
                facts |= _facts_sync(client, config=True)
                raise ConfigError(refusal(probe, reply, facts))
    _note_slow(durability, elapsed)


def _facts_sync(client: redis.Redis, *, config: bool = False) -> dict[str, str]:
    """Blocking twin of :func:`_facts_async`."""
    if is_cluster(client):
        return {}
    replies: list[object] = []
    calls: list[Any] = [lambda: client.info("server"), lambda: client.info("replication")]
    calls.append((lambda: client.config_get("append*")) if config else None)
    for call in calls:
        try:
            replies.append(None if call is None else call())
        except rx.RedisError:
            replies.append(None)
    return _facts(*replies)


__all__ = [
    "PROBE_TIMEOUT_S",
    "check_durability",
    "check_durability_sync",
    "check_durable",
    "make_durable",
    "probe_keys",
    "queue_durable",
    "refusal",
]
