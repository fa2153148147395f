"""A shard whose stored state cannot be read is set aside, never crash-looped.

While :meth:`ShardStateStore.load` raises :class:`ShardStateUnreadable`, the
shard's runner reads nothing from the shard's stream (its entries wait,
pending or unread) and writes nothing but a marker hash
``cf:<fleet>:{s<n>}:state:aside`` (worker, key, field, reason, at), which
``commitfleet status`` shows. It announces the set-aside once (an error log
line and a ``shard_set_aside`` admin event), then tries the load again when
the marker is deleted (the operator's signal that the record was fixed or
removed) or every :data:`RETRY_S` seconds; the other shards are untouched.
Once the state reads, the marker goes and the shard runs as usual.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from shared import kv
from shared.events import ShardSetAside
from shared.queue import as_text, redis_errors

from ._context import WorkerContext
from ._core import ShardJobs
from ._ledger import ShardLedger
from ._state_store import ShardStateStore, ShardStateUnreadable

log = logging.getLogger("workers.shard")

RETRY_S: Final = 60.0
"""How often a set-aside shard tries its state again without being asked."""
POLL_S: Final = 1.0
"""How often a set-aside shard looks whether its marker was deleted."""


def aside_key(ctx: WorkerContext, shard: int) -> str:
    """Return the key of the shard's set-aside marker hash."""
    return ctx.keys.shard_state(shard, "aside")


async def load_or_set_aside(
    ctx: WorkerContext, ledger: ShardLedger, stopping: asyncio.Event
) -> ShardJobs | None:
    """Return the shard's state once it can be read (the ledger's state from then on: read by
    :meth:`ShardLedger.reload` through its session's store); None when ``stopping`` is set first.

    Raises:
        Fenced: the shard's owner token is no longer ours (checked before the
            marker is written, so a former owner never writes it).
        TransientError: Redis unavailable (the caller restarts its session).

    Cancellation: nothing to undo; the marker stays until the state reads.
    """
    store = ledger.store
    assert store is not None
    marker = aside_key(ctx, store.shard)
    announced: tuple[str, str, str] | None = None
    while True:
        try:
            state = await ledger.reload()
        except ShardStateUnreadable as exc:
            problem = (exc.key, exc.field, exc.reason)
        else:
            with redis_errors("clear set-aside marker"):
                cleared = await ctx.redis.delete(marker)
            if cleared or announced is not None:
                log.warning("shard state readable again; shard back in service", extra=kv(shard=store.shard))
            return state
        with redis_errors("read set-aside marker"):
            current = await ctx.redis.hgetall(marker)
        # Announce once per problem; again only when the operator cleared the marker
        # (a retry they asked for failed). A restarted session finds its own marker.
        marked = (as_text(current.get(b"key", b"")), as_text(current.get(b"field", b"")))
        if not current or (problem != announced and marked != problem[:2]):
            await _announce(ctx, store, marker, problem)
        else:
            log.debug("shard still set aside", extra=kv(shard=store.shard, field=problem[1]))
        announced = problem
        if not await _wait_for_retry(ctx, marker, stopping):
            return None


async def _announce(
    ctx: WorkerContext, store: ShardStateStore, marker: str, problem: tuple[str, str, str]
) -> None:
    key, field, reason = problem
    await store.check_owner()
    now = time.time()
    with redis_errors("write set-aside marker"):
        await ctx.redis.hset(
            marker,
            mapping={"worker": ctx.worker_id, "key": key, "field": field, "reason": reason, "at": repr(now)},
        )
    log.error(
        "shard set aside: its state in Redis cannot be read; fix or delete the field"
        " (redis-cli HDEL), then delete the marker to resume (docs/queue.md)",
        extra=kv(shard=store.shard, key=key, field=field, reason=reason, marker=marker),
    )
    await ctx.emit(
        ShardSetAside(at=now, worker=ctx.worker_id, shard=store.shard, key=key, field=field, reason=reason)
    )


async def _wait_for_retry(ctx: WorkerContext, marker: str, stopping: asyncio.Event) -> bool:
    """Return False when ``stopping`` is set; True after RETRY_S or once the marker is gone."""
    deadline = time.monotonic() + RETRY_S
    while time.monotonic() < deadline:
        try:
            await asyncio.wait_for(stopping.wait(), POLL_S)
        except TimeoutError:
            pass
        if stopping.is_set():
            return False
        with redis_errors("read set-aside marker"):
            if not await ctx.redis.exists(marker):
                return True
    return True
