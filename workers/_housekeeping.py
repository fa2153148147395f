"""A shard owner's housekeeping in Redis: trimming its streams, recording its quarantines.

Both run outside the intake path: trimming on the shard's timer
(``queue.trim_interval``), the quarantine record at each session start.
"""

from __future__ import annotations

import logging

from shared._logging import kv
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
    the same MULTI as its effect on the shard state, so its effect is
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
    walking the store's ``_wal/`` per request; quarantines found later by a
    commit show in the job records. One script (DEL + HSET). Returns None.

    Raises:
        TransientError: Redis is unreachable.
    """
    quarantined = {k: v for k, v in found.items() if v}
    key = ctx.keys.shard_state(shard, "quarantined")
    flat = [x for kv_pair in quarantined.items() for x in kv_pair]
    with redis_errors("record quarantined"):
        await ctx.redis.eval(_REPLACE_HASH, 1, key, *flat)


__all__ = ["record_quarantined", "trim_shard"]
