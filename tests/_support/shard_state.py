"""A shard's saved state in Redis, set up for the state-store tests: pending entries, a batch to save."""

from __future__ import annotations

from typing import NamedTuple

import redis.asyncio

from shared.events import StagedFile
from shared.queue import DatasetResult, Keys, ShardConsumer
from workers import JobMeta as Meta
from workers._core import Attempt, Ended, ShardJobs
from workers._state_store import Batch, ShardStateStore

SHARD = 3


async def pending_entries(r: redis.asyncio.Redis, keys: Keys, n: int) -> list[bytes]:
    """Return the ids of ``n`` new entries of shard SHARD, read (so pending) by consumer w1."""
    consumer = ShardConsumer(r, keys, SHARD, consumer="w1")
    await consumer.ensure_group()
    for i in range(n):
        await r.xadd(keys.events(SHARD), {"data": f"e{i}"})
    return [e.id for e in await consumer.read(n, 10)]


def state_and_batch(ids: list[bytes], attempts: int) -> tuple[ShardJobs, Batch]:
    """Return open jobs j1, j2 (j0 ended) and a batch to save: ``attempts`` attempts of j1, j0's results,
    acknowledging ``ids``."""
    state = ShardJobs()
    state.jobs["j1"] = Meta(job="j1", opened_at=1.0, deadline=2.0, datasets={})
    state.jobs["j2"] = Meta(job="j2", opened_at=1.0, deadline=2.0, datasets={})
    state.ended["j0"] = Ended(status="committed", at=3.0)
    batch = Batch(jobs={"j1", "j2", "gone"}, ended={"j0"}, ack=list(ids))
    for t in range(attempts):
        rec = Attempt(task=t, attempt=0, files=[StagedFile(path=f"p-{t}", size=t)], seq=t + 1)
        batch.attempts[("j1", "ds", t, 0)] = rec
    batch.results[("j0", "ds")] = DatasetResult(status="committed", files=1)
    batch.results[("j0", "other")] = DatasetResult(status="aborted", reason="failed")
    return state, batch


class Backlog(NamedTuple):
    """A shard's store for consumer w1, a batch of pending entries to save, and newer entries."""

    store: ShardStateStore
    state: ShardJobs
    batch: Batch
    ids: list[bytes]
    later: list[bytes]


async def owned_backlog(
    r: redis.asyncio.Redis,
    keys: Keys,
    *,
    owner: bytes = b"w1@1",
    pending: int = 2,
    later: int = 0,
    attempts: int = 1,
) -> Backlog:
    """Return w1's store with ``pending`` entries read (batched with ``attempts`` attempt records)
    and ``later`` entries added after them; the shard is owned by ``owner``."""
    await r.set(keys.shard_state(SHARD, "owner"), owner)
    ids = await pending_entries(r, keys, pending)
    newer = [await r.xadd(keys.events(SHARD), {"data": f"n{i}"}) for i in range(later)]
    state, batch = state_and_batch(ids, attempts=attempts)
    return Backlog(ShardStateStore(r, keys, SHARD, b"w1@1", consumer="w1"), state, batch, ids, newer)
