"""The worker process: membership, following the assignment, running owned shards.

Shutdown (SIGTERM, or :meth:`Worker.shutdown`; safe to call twice) runs in
phases:

1. stop intake: every shard runner stops reading its stream;
2. drain: in-flight commits and aborts get ``worker.drain_grace`` seconds to
   finish, then are cancelled (each releases its dataset lock, shielded; an
   interrupted commit stays in the WAL and the shard's next owner recovers it);
3. hand back: each stopped shard is confirmed to the coordinator, so it can
   move the shard at once instead of waiting for our lease to expire;
4. leave: the membership lease is deleted, ``worker_left`` is published and
   the clients are closed.

A SIGKILL skips all of this and loses nothing: messages are acknowledged only
once durable, the lease expires, and the next owner takes over the pending
entries and the unfinished sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from typing import Any

from shared import CommitfleetError, Fenced, Settings, TransientError
from shared._aio import cancel_until_done
from shared._logging import kv
from shared.events import ValidationLimits, WorkerJoined, WorkerLeft
from shared.fleet import FleetRegistry, new_worker_id, worker_info
from shared.locks import run_shielded
from shared.queue import AdminPublisher, Keys, connect, ensure_fleet
from shared.storage import open_store

from ._context import WorkerContext
from ._shard import ShardRunner

log = logging.getLogger("workers")

FOLLOW_INTERVAL_S = 0.25


class Worker:
    """One worker process (see the module doc for its shutdown phases)."""

    def __init__(self, settings: Settings, *, worker_id: str | None = None) -> None:
        """Prepare a worker; nothing connects until :meth:`run`.

        Raises:
            ConfigError: no store URL configured, or a bad worker id.
        """
        if not settings.store.url:
            from shared import ConfigError

            raise ConfigError("store.url is required (set COMMITFLEET_STORE or store.url in the config file)")
        self.settings = settings
        self.worker_id = new_worker_id(worker_id or settings.worker.id)
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        self._runners: dict[int, tuple[ShardRunner, asyncio.Task[None]]] = {}
        self._retry_at: dict[int, float] = {}

    def shutdown(self) -> None:
        """Begin the phased shutdown (idempotent; returns at once)."""
        self._stop.set()

    @property
    def running_shards(self) -> frozenset[int]:
        """Return the shards with a live runner."""
        return frozenset(s for s, (_r, t) in self._runners.items() if not t.done())

    async def run(self) -> None:
        """Join the fleet and work until :meth:`shutdown`; then leave in phases.

        Raises:
            ConfigError: the fleet has another shard count, or a setting is unusable.

        Cancellation: treated like a shutdown without the grace period (runners
        are cancelled, locks released shielded, the lease deleted shielded).
        """
        s = self.settings
        keys = Keys(s.fleet.name)
        redis_client = connect(s.redis, client_name=f"commitfleet-worker-{self.worker_id}")
        try:
            async with open_store(s.store.url, s.store) as store:
                await ensure_fleet(redis_client, s.fleet.name, s.fleet.shards)
                registry = FleetRegistry(redis_client, keys)
                ctx = WorkerContext(
                    settings=s,
                    worker_id=self.worker_id,
                    redis=redis_client,
                    store=store,
                    keys=keys,
                    registry=registry,
                    admin=AdminPublisher(redis_client, keys, maxlen=s.admin.stream_maxlen),
                    limits=ValidationLimits.from_settings(s.security),
                    inflight=asyncio.Semaphore(s.worker.max_inflight_datasets),
                )
                started = time.time()
                await registry.register(worker_info(self.worker_id, started), s.worker.lease)
                await ctx.emit(
                    WorkerJoined(
                        at=time.time(), worker=self.worker_id, host=socket.gethostname(), pid=os.getpid()
                    )
                )
                log.info("worker joined", extra=kv(worker=self.worker_id, fleet=s.fleet.name))
                self.ready.set()
                try:
                    async with asyncio.TaskGroup() as tg:
                        beat = tg.create_task(self._heartbeat(registry, started))
                        await self._follow(ctx, tg)
                        # Phases 1-3: stop intake, drain, hand back.
                        await self._stop_all(ctx)
                        await cancel_until_done(beat)
                finally:
                    # Phase 4, shielded: a cancelled worker still leaves cleanly.
                    await run_shielded(self._leave(ctx))
        finally:
            await run_shielded(redis_client.aclose())

    async def _leave(self, ctx: WorkerContext) -> None:
        try:
            await ctx.registry.deregister(self.worker_id)
            await ctx.emit(WorkerLeft(at=time.time(), worker=self.worker_id, reason="shutdown"))
        except TransientError as exc:
            log.warning("could not deregister; the lease will expire", extra=kv(error=str(exc)))
        log.info("worker left", extra=kv(worker=self.worker_id))

    async def _heartbeat(self, registry: FleetRegistry, started: float) -> None:
        s = self.settings.worker
        while True:
            await asyncio.sleep(s.heartbeat)
            try:
                info = worker_info(self.worker_id, started)
                if not await registry.renew(info, s.lease):
                    # We were presumed dead (frozen, or cut off from Redis): our
                    # shards may have moved; their owner tokens fence us.
                    log.warning(
                        "membership lease had expired; re-registering", extra=kv(worker=self.worker_id)
                    )
                    await registry.register(info, s.lease)
            except TransientError as exc:
                log.warning("heartbeat failed", extra=kv(error=str(exc)))

    async def _follow(self, ctx: WorkerContext, tg: asyncio.TaskGroup) -> None:
        """Start and stop shard runners as the assignment says, until shutdown."""
        shards = self.settings.fleet.shards
        while not self._stop.is_set():
            try:
                assignment = await ctx.registry.assignment(shards)
                await self._reconcile(
                    ctx, tg, assignment.runnable(self.worker_id), assignment.releasing(self.worker_id)
                )
            except TransientError as exc:
                log.warning("cannot read the assignment", extra=kv(error=str(exc)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), FOLLOW_INTERVAL_S)

    async def _reconcile(
        self, ctx: WorkerContext, tg: asyncio.TaskGroup, want: frozenset[int], releasing: frozenset[int]
    ) -> None:
        now = time.monotonic()
        for shard, (runner, task) in list(self._runners.items()):
            if task.done():
                del self._runners[shard]
                self._reap(shard, task)
            elif shard not in want:
                runner.request_stop()
        for shard in releasing:
            if shard not in self._runners:
                await ctx.registry.confirm_stopped(shard, self.worker_id)
        for shard in sorted(want - self._runners.keys()):
            if self._retry_at.get(shard, 0.0) > now:
                continue
            token = await ctx.registry.owner_token(shard)
            if token is None or not token.decode().startswith(f"{self.worker_id}@"):
                continue  # the coordinator has not handed it to us yet
            runner = ShardRunner(ctx, shard)
            self._runners[shard] = (runner, tg.create_task(self._supervise(runner)))
            log.info("shard started", extra=kv(shard=shard, worker=self.worker_id))

    async def _supervise(self, runner: ShardRunner) -> None:
        try:
            await runner.run()
        except Fenced as exc:
            log.warning("shard lost to another owner", extra=kv(shard=runner.shard, error=str(exc)))
        except CommitfleetError as exc:
            log.exception("shard runner failed; restarting it", extra=kv(shard=runner.shard, error=repr(exc)))
            self._retry_at[runner.shard] = time.monotonic() + 2.0
        else:
            log.info("shard stopped", extra=kv(shard=runner.shard))

    def _reap(self, shard: int, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:  # _supervise handles ours; anything else is a bug
            raise exc

    async def _stop_all(self, ctx: WorkerContext) -> None:
        runners = list(self._runners.items())
        for _shard, (runner, _task) in runners:
            runner.request_stop()
        if runners:
            await asyncio.wait([t for _s, (_r, t) in runners])
        for shard, _ in runners:
            with contextlib.suppress(TransientError):
                await ctx.registry.confirm_stopped(shard, self.worker_id)
        self._runners.clear()


async def run_worker(settings: Settings, *, worker_id: str | None = None) -> None:
    """Run a worker until SIGTERM/SIGINT, then shut down in phases.

    Raises:
        ConfigError: bad configuration or a fleet with another shard count.
    """
    import signal

    worker = Worker(settings, worker_id=worker_id)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.shutdown)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    try:
        await worker.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(sig)


def dump_tasks() -> None:
    """Write every asyncio task's stack to stderr (on SIGUSR1: what is a stuck process waiting for?)."""
    import sys

    tasks = asyncio.all_tasks()
    lines = [f"--- {len(tasks)} asyncio tasks ---"]
    for task in tasks:
        lines.append(f"task {task.get_name()}:")
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
            if frame is not None:
                lines.append(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
        if coro is None and lines[-1].startswith("task "):
            lines.append("    (not started or finished)")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()
