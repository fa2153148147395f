"""An in-process coordinator and worker for the intake tests, plus dead-letter probes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio

from coordinator import Coordinator
from shared import Settings
from shared.queue import AsyncPublisher, DeadLetter, Keys, ensure_fleet, read_dead_letters
from shared.storage import ObjectStore, open_store
from workers import Probe, Worker

from ._helpers import fleet_settings


@dataclass
class InProcessFleet:
    """Handles on a running in-process fleet of one coordinator and one worker."""

    settings: Settings
    store: ObjectStore
    redis: redis.asyncio.Redis
    worker: Worker
    worker_task: asyncio.Task[None]
    publisher: AsyncPublisher

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.fleet.name)

    def worker_alive(self) -> bool:
        """Return True while the worker's run() has neither returned nor raised."""
        return not self.worker_task.done()

    async def dead(self, shard: int) -> list[DeadLetter]:
        """Return the shard's dead letters."""
        return await read_dead_letters(self.redis, self.keys, shard)


@asynccontextmanager
async def inprocess_fleet(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    root: Path,
    *,
    worker_id: str = "w1",
    probe: Probe | None = None,
    **overrides: Any,
) -> AsyncIterator[InProcessFleet]:
    """Run a coordinator and one worker in this process until the block ends, then shut them down.

    ``probe``: the worker's probe (``workers._probe``), by default nothing."""
    settings = fleet_settings(redis_url, root, fleet_name, **overrides)
    await ensure_fleet(redis_client, fleet_name, settings.fleet.shards)
    coord = Coordinator(settings, coordinator_id="c1")
    worker = Worker(settings, worker_id=worker_id, probe=probe)
    secret = settings.security.hmac_secret.reveal_bytes()
    publisher = AsyncPublisher(redis_client, fleet_name, settings.fleet.shards, secret=secret)
    async with open_store(settings.store.url, settings.store) as store, asyncio.TaskGroup() as tg:
        coord_task = tg.create_task(coord.run())
        worker_task = tg.create_task(worker.run())
        try:
            yield InProcessFleet(settings, store, redis_client, worker, worker_task, publisher)
        finally:
            worker.shutdown()
            coord.shutdown()
            await asyncio.wait([coord_task, worker_task])
