"""A shard owner's housekeeping in Redis: trimming its streams, recording its quarantines.

Both run outside the intake path: trimming on the shard's timer
(``queue.trim_interval``); the quarantine record is rewritten whole at each
session start (from the WAL) and kept up to date field by field in between,
when a commit or a recovery quarantines a sequence and when an operator's
retry or skip ends one.
"""

from __future__ import annotations

import logging

from shared import kv
from shared.queue import cap_dead_letters, redis_errors, trim_acknowledged

from ._context import WorkerContext

# DEL + HSET in one step. A script rather than MULTI/EXEC: one plain command on Redis
# Cluster too (redis-py 8.1's asyncio cluster transactions run on a thread's event loop).
_REPLACE_HASH = """
redis.call('DEL', KEYS[1])
if #ARGV > 0 then redis.call('HSET', KEYS[1], unpack(ARGV)) end
return 1
"""

log = logging.getLogger("workers.shard")


async def trim_shard(ctx: WorkerContext, shard: int, now: float) -> None:
    """Drop what the shard's streams no longer need (docs/queue.md, "What is kept").

    Acknowledged entries leave the event stream (an entry is acknowledged in
    the same atomic save as its effect on the shard state, so its effect is
    durable); dead letters are capped by count and age. Returns None.

    Raises:
        TransientError: Redis is unreachable (the next tick tries again).
    """
    q = ctx.settings.queue
    trimmed = await trim_acknowledged(ctx.redis, ctx.keys.events(shard))
    capped = await cap_dead_letters(
        ctx.redis,
        ctx.keys,
        shard,
        maxlen=q.dead_letter_maxlen,
        max_age_s=q.dead_letter_max_age,
        now_ms=int(now * 1000),
    )
    if trimmed.removed or capped:
        log.debug(
            "trimmed shard streams", extra=kv(shard=shard, acknowledged=trimmed.removed, dead_letters=capped)
        )


async def record_quarantined(ctx: WorkerContext, shard: int, found: dict[str, str]) -> None:
    """Replace the shard's ``state:quarantined`` hash (``<dataset>/<job>`` -> reason) by ``found``.

    ``found`` maps every unfinished sequence of the shard to its quarantine
    reason ("" when not quarantined). Status reads this record instead of
    walking the store's ``_wal/`` per request; :func:`note_quarantine` keeps it
    current during the session. One script (DEL + HSET). Returns None.

    Raises:
        TransientError: Redis is unreachable.
    """
    quarantined = {k: v for k, v in found.items() if v}
    key = ctx.keys.shard_state(shard, "quarantined")
    flat = [x for kv_pair in quarantined.items() for x in kv_pair]
    with redis_errors("record quarantined"):
        await ctx.redis.eval(_REPLACE_HASH, 1, key, *flat)


async def note_quarantine(ctx: WorkerContext, shard: int, dataset: str, job: str, reason: str | None) -> None:
    """Set (``reason``) or clear (None) one sequence in the shard's ``state:quarantined`` hash.

    Called when the sequence's quarantine starts (a commit or a recovery
    quarantined it) or ends (retry committed it, skip rolled it back), so
    status shows it at once, not at the shard's next session start. Returns None.

    Raises:
        TransientError: Redis is unreachable (the caller's work is retried,
            or the next session start rewrites the record from the WAL).
    """
    key = ctx.keys.shard_state(shard, "quarantined")
    field = f"{dataset}/{job}"
    with redis_errors("record quarantined"):
        if reason is None:
            await ctx.redis.hdel(key, field)
        else:
            await ctx.redis.hset(key, field, reason or "quarantined")


__all__ = ["note_quarantine", "record_quarantined", "trim_shard"]
