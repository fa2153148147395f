"""The in-process test fleet: settings for a fast fleet, and a coordinator with workers run in this process.

:func:`inprocess_fleet` is the one set-up of a coordinator and its workers as
asyncio tasks of the test (the fleet tests of real processes use the
``fleet`` fixture of tests/fleet/conftest.py instead).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import redis.asyncio

from coordinator import Coordinator
from shared import Settings, load_settings
from shared.events import AdminEvent
from shared.queue import AsyncPublisher, DeadLetter, Keys, ensure_fleet, read_admin_range, read_dead_letters
from shared.spark import ProducerConfig
from shared.storage import ObjectStore, open_store
from shared.tracing import Tracer
from workers import Probe, Worker


def fleet_settings(redis_url: str, root: Path, fleet: str, *, shards: int = 8, **extra: Any) -> Settings:
    """Return settings for a fast test fleet on a local-files root.

    ``extra`` maps a settings section to overrides of some of its values
    (``worker={"lease": 6.0}``), merged into the fast defaults.
    """
    overrides: dict[str, Any] = {
        "fleet": {"name": fleet, "shards": shards},
        "redis": {"url": redis_url},
        "store": {"url": root.as_uri()},
        "lock": {"validity": 6.0, "renew_interval": 1.5, "max_drift": 0.2, "poll_min": 0.02, "poll_max": 0.3},
        "worker": {"lease": 3.0, "heartbeat": 0.5, "read_block_ms": 200, "drain_grace": 10.0},
        "coordinator": {"tick": 0.2, "http_port": 0},
        "commit": {"retry": {"attempts": 4, "initial": 0.01, "maximum": 0.1, "budget": 5.0}},
        "log": {"level": "INFO", "format": "text"},
    }
    for section, values in extra.items():
        overrides.setdefault(section, {}).update(values)
    return load_settings(env={}, overrides=overrides)


def producer_config(settings: Settings, job_timeout: float, wait_timeout: float = 30.0) -> ProducerConfig:
    """Return a Spark producer's configuration for the fleet of ``settings``, with these timeouts."""
    base = ProducerConfig.from_settings(settings, job_timeout=job_timeout)
    return msgspec.structs.replace(base, wait_timeout=wait_timeout)


@dataclass
class InProcessFleet:
    """Handles on a running in-process fleet: one coordinator ``c1`` and its workers."""

    settings: Settings
    store: ObjectStore
    redis: redis.asyncio.Redis
    coordinator: Coordinator
    coordinator_task: asyncio.Task[None]
    workers: list[Worker]
    worker_tasks: list[asyncio.Task[None]]
    publisher: AsyncPublisher
    spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] = field(repr=False)
    probe: Probe | None = None
    tracer: Tracer | None = None

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.fleet.name)

    @property
    def worker(self) -> Worker:
        """The first worker."""
        return self.workers[0]

    @property
    def worker_task(self) -> asyncio.Task[None]:
        """The task running the first worker."""
        return self.worker_tasks[0]

    def worker_alive(self) -> bool:
        """Return True while the first worker's run() has neither returned nor raised."""
        return not self.worker_task.done()

    async def dead(self, shard: int) -> list[DeadLetter]:
        """Return the shard's dead letters."""
        return await read_dead_letters(self.redis, self.keys, shard)

    async def admin_events(self) -> list[AdminEvent]:
        """Return every admin event so far."""
        return [ev for _id, ev in await read_admin_range(self.redis, self.keys)]

    def start_worker(self, worker_id: str) -> tuple[Worker, asyncio.Task[None]]:
        """Start one more worker (it joins :attr:`workers`); return it and the task running it."""
        worker = Worker(self.settings, worker_id=worker_id, probe=self.probe, tracer=self.tracer)
        task = self.spawn(worker.run())
        self.workers.append(worker)
        self.worker_tasks.append(task)
        return worker, task

    async def stop_coordinator(self) -> None:
        """Stop the coordinator and wait for it; the workers keep the assignment they follow.

        For a test that overwrites a shard's owner token to play another owner:
        a running coordinator makes every active shard's token name its
        assigned owner again on its next tick (fencing whoever else holds it),
        and would hand the shard back before the worker ever saw it fenced.
        """
        self.coordinator.shutdown()
        await asyncio.wait([self.coordinator_task])

    async def stop(self, timeout: float | None = None) -> None:
        """Ask every worker and the coordinator to stop, and wait (at most ``timeout`` s) for them to end.

        Does not raise what a process raised (the task group, or the test, sees
        it). The block's end calls it; a test that checks what is left once
        nothing runs calls it first.
        """
        for w in self.workers:
            w.shutdown()
        self.coordinator.shutdown()
        await asyncio.wait([*self.worker_tasks, self.coordinator_task], timeout=timeout)


@asynccontextmanager
async def inprocess_fleet(
    redis_client: redis.asyncio.Redis,
    settings: Settings,
    *,
    workers: Sequence[str] = ("w1",),
    ensure: bool = True,
    workers_may_fail: bool = False,
    probe: Probe | None = None,
    tracer: Tracer | None = None,
) -> AsyncIterator[InProcessFleet]:
    """Run a coordinator ``c1`` and one worker per id of ``workers`` in this process until the block ends.

    ``settings`` (see :func:`fleet_settings`) are every process's; the store
    handle is opened from them, the publisher signs with their secret (and waits
    for their ``redis.durability``) and
    ``redis_client`` is the test's own client. ``ensure``: create the fleet's
    streams and groups before anything starts (as ``commitfleet init`` does).
    ``probe``: every worker's probe (:mod:`workers._probe`, e.g. a gate of
    :mod:`tests._support.checkpoints`), by default nothing. ``tracer``: every
    worker's tracer (e.g. over an in-memory exporter), by default the settings'.

    At the block's end every process is asked to stop and is waited for. By
    default they run in a task group: one that raises fails the test at once,
    and the block's end re-raises it (in an ExceptionGroup). With
    ``workers_may_fail`` they are plain tasks, for tests that make a worker
    fail on purpose and look at ``worker_task`` themselves; the coordinator must
    still end cleanly (asserted) within 60 s.
    """
    fleet_name = settings.fleet.name
    shards = settings.fleet.shards
    if ensure:
        await ensure_fleet(redis_client, fleet_name, shards)
    coord = Coordinator(settings, coordinator_id="c1")
    members = [Worker(settings, worker_id=wid, probe=probe, tracer=tracer) for wid in workers]
    secret = settings.security.hmac_secret.reveal_bytes()
    publisher = AsyncPublisher(
        redis_client, fleet_name, shards, secret=secret, durability=settings.redis.durable
    )
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(settings.store.url, settings.store))
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]
        if workers_may_fail:
            spawn = asyncio.create_task
        else:
            spawn = (await stack.enter_async_context(asyncio.TaskGroup())).create_task
        coord_task = spawn(coord.run())
        worker_tasks = [spawn(w.run()) for w in members]
        fleet = InProcessFleet(
            settings,
            store,
            redis_client,
            coord,
            coord_task,
            members,
            worker_tasks,
            publisher,
            spawn,
            probe,
            tracer,
        )
        try:
            yield fleet
        finally:
            await fleet.stop(timeout=60 if workers_may_fail else None)
        if workers_may_fail:
            assert coord_task.done() and not coord_task.cancelled() and coord_task.exception() is None
