"""The worker process: membership, following the assignment, running owned shards.

Start: while Redis cannot be reached the worker waits and tries again with a
capped, jittered backoff, logging each wait (SIGTERM ends the wait at once,
exit 0). The shard count comes from the fleet's record in Redis; a
``fleet.shards`` that disagrees is a ConfigError (exit 2).

Shutdown (SIGTERM, or :meth:`Worker.shutdown`; safe to call twice) runs in
phases:

1. stop intake: every shard runner stops reading its stream;
2. drain: in-flight commits and aborts get ``worker.drain_grace`` seconds to
   finish, then are cancelled (each releases its dataset lock, shielded; an
   interrupted commit stays in the WAL and the shard's next owner recovers it);
3. hand back: every stopped shard is confirmed to the coordinator in one
   write (at most ``HANDBACK_TIMEOUT_S``), so it can move the shards at once
   instead of waiting for our lease to expire;
4. leave: the membership lease is deleted, ``worker_left`` is published (each
   at most ``LEAVE_TIMEOUT_S``) and the clients are closed (the Redis client
   at most ``CLOSE_TIMEOUT_S``).

Everything after the drain is bounded, so a worker exits within
``worker.drain_grace`` plus a few seconds even with Redis down or hung; the
log line ``worker shut down`` gives each phase's seconds. From the signal to
the end of its drain, readiness (``/readyz``) fails and liveness holds.

What ends only one shard, and what ends the process: a shard runner that
raises a :class:`~shared.CommitfleetError` (fenced by a new owner, a shard set
aside, state it cannot use) or that ends on its own ends that shard only; the
worker starts it again later (capped backoff, so a shard that keeps failing is
not restarted in a tight loop) while it still owns it. Any other exception, in
a shard runner or its actions, the heartbeat or the assignment follower, is a
bug and fatal (:class:`~shared.fleet.ProcessTasks`): its traceback is logged
at once, every shard is stopped without grace, the worker leaves with
``worker_left`` reason ``crashed`` (best effort: Redis may be the cause), and
:meth:`Worker.run` raises :class:`~shared.fleet.ProcessCrashed` (exit 70). A
process that has not ended a few seconds later is ended anyway.

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
from dataclasses import dataclass

import redis.asyncio

from shared import ConfigError, Fenced, Settings, TransientError, cancel_until_done, kv, nonce, run_shielded
from shared.events import ValidationLimits, WorkerJoined, WorkerLeft
from shared.fleet import (
    HARD_EXIT_AFTER_S,
    FleetRegistry,
    ProcessCrashed,
    ProcessTasks,
    WorkerInfo,
    dump_tasks,
    new_worker_id,
    wait_until_up,
    worker_info,
)
from shared.locks import SharedReleaseNotifier
from shared.queue import AdminPublisher, Keys, connect, join_fleet
from shared.storage import open_store
from shared.tracing import Tracer, open_tracer

from ._context import WorkerContext
from ._core import Limits
from ._health import HealthMonitor, WorkerStats
from ._health_http import HealthServer
from ._health_metrics import WorkerMetrics
from ._heap import trim_heap_forever, tune_gc
from ._probe import Probe, no_probe
from ._runners import ShardRunners

log = logging.getLogger("workers")

FOLLOW_INTERVAL_S = 0.25
# After a fatal error: how long stopped shards may take to end before we leave anyway,
# and how long leaving (deregister, worker_left) may take when Redis is slow or down.
CRASH_SETTLE_S = 1.0
LEAVE_TIMEOUT_S = 1.5
# How long handing the shards back (phase 3, one Redis write) may take before the worker leaves anyway.
HANDBACK_TIMEOUT_S = 2.0
# How long closing the Redis client and the store may take at the very end.
CLOSE_TIMEOUT_S = 2.0


@dataclass(slots=True)
class ShutdownPhases:
    """When each shutdown phase ended (``time.monotonic()``; None: not reached), for the log line
    ``worker shut down`` that gives each phase's seconds."""

    asked: float | None = None
    drained: float | None = None
    handed_back: float | None = None
    left: float | None = None
    closed: float | None = None

    def seconds(self) -> dict[str, float]:
        """Return the seconds of each phase reached (``drain_s``, ``handback_s``, ``leave_s``,
        ``close_s``) and of them all (``total_s``)."""
        marks = [
            ("drain_s", self.drained),
            ("handback_s", self.handed_back),
            ("leave_s", self.left),
            ("close_s", self.closed),
        ]
        out: dict[str, float] = {}
        before = self.asked
        for name, at in marks:
            if before is not None and at is not None:
                out[name] = round(at - before, 3)
                before = at
        if self.asked is not None and self.closed is not None:
            out["total_s"] = round(self.closed - self.asked, 3)
        return out


class Worker:
    """One worker process (see the module doc for its start, shutdown and crash)."""

    def __init__(
        self,
        settings: Settings,
        *,
        worker_id: str | None = None,
        hard_exit_after: float | None = None,
        probe: Probe | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        """Prepare a worker; nothing connects until :meth:`run`.

        ``hard_exit_after``: after a fatal error, end the OS process that many
        seconds later if it is still alive (set by :func:`run_worker`; never in
        an in-process test). ``probe``: awaited at each named point of the
        commit path and intake (:mod:`workers._probe`; a test's hook, by default nothing).
        ``tracer``: the spans' tracer, owned by the caller; None: the one
        ``tracing`` settings choose (:func:`shared.tracing.open_tracer`), opened
        by :meth:`run` and closed (flushed) when it ends.

        Raises:
            ConfigError: no store URL configured, or a bad worker id.
        """
        if not settings.store.url:
            raise ConfigError("store.url is required (set COMMITFLEET_STORE or store.url in the config file)")
        self.settings = settings
        self.worker_id = new_worker_id(worker_id or settings.worker.id)
        # This process's mark in its lease: another process given the same id is told apart.
        self._instance = f"{os.getpid()}-{nonce()}"
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        self._hard_exit_after = hard_exit_after
        self._probe = probe or no_probe
        self._tracer = tracer
        self._shards = ShardRunners(settings, self.worker_id)
        self._runners = self._shards.by_shard  # shard -> (runner, task); the same dict, never replaced
        # Set when the worker starts leaving: its heartbeat must not bring it back.
        self._leaving = asyncio.Event()
        w = settings.worker
        # What the health endpoint judges from (recorded whether it is served or not).
        self.health = HealthMonitor(
            Limits(
                lease=w.lease,
                heartbeat=w.heartbeat,
                max_loop_lag=w.max_loop_lag,
                redis_timeout=settings.redis.socket_timeout,
            )
        )
        self.health_port: int | None = None  # the bound port of the health endpoint, once serving
        self._phases = ShutdownPhases()

    def shutdown(self) -> None:
        """Begin the phased shutdown (idempotent; returns at once)."""
        self.health.stopping()
        if self._phases.asked is None:
            self._phases.asked = time.monotonic()
        self._stop.set()

    @property
    def running_shards(self) -> frozenset[int]:
        """Return the shards with a live runner."""
        return frozenset(s for s, (_r, t) in self._runners.items() if not t.done())

    def stats(self) -> WorkerStats:
        """Return the shards with a live runner, and the work running and queued in them (cheap)."""
        runners = [r for r, t in self._runners.values() if not t.done()]
        return WorkerStats(
            shards_owned=len(runners),
            inflight=sum(len(r.scheduler.tasks) for r in runners),
            queued=sum(len(r.scheduler.queue) for r in runners),
        )

    async def run(self) -> None:
        """Join the fleet and work until :meth:`shutdown`; then leave in phases.

        With ``worker.http_port`` set, the health endpoint (:mod:`workers._health_http`)
        and its loop ticker serve from before Redis is first reached until the worker
        has left (through every shutdown phase: liveness holds while it drains).

        Returns without joining when shut down while waiting for Redis.

        Raises:
            ConfigError: ``fleet.shards`` disagrees with the fleet's record, or
                a setting is unusable (Redis refuses our credentials).
            ProcessCrashed: an unexpected error in any part of the worker (its
                traceback was logged when it happened; the worker has left with
                reason ``crashed``).

        Cancellation: treated like a shutdown without the grace period (runners
        are cancelled, locks released shielded, the lease deleted shielded).
        """
        w = self.settings.worker
        if not w.http_port:
            await self._run()
            return
        server = HealthServer(
            w.http_host, w.http_port, self.health, WorkerMetrics(self.worker_id, self.health, self.stats)
        )
        await server.start()  # a ConfigError before anything connects (exit 2)
        self.health_port = server.port
        ticker = asyncio.ensure_future(self.health.tick_forever())
        try:
            await self._run()
        finally:
            await run_shielded(server.stop())
            await run_shielded(cancel_until_done(ticker))

    async def _run(self) -> None:
        """The body of :meth:`run` (same returns, raises and cancellation)."""
        s = self.settings
        tracer = self._tracer or open_tracer(s.tracing, service="commitfleet-worker")
        try:
            await self._run_traced(tracer)
        finally:
            if self._tracer is None and tracer.enabled:
                # Flushing may wait on the exporter (bounded by OTEL_BSP_EXPORT_TIMEOUT): not on the loop.
                await run_shielded(asyncio.to_thread(tracer.close))

    async def _run_traced(self, tracer: Tracer) -> None:
        """The worker's life with its tracer open (same returns, raises and cancellation as :meth:`run`)."""
        s = self.settings
        redis_client = connect(s.redis, client_name=f"commitfleet-worker-{self.worker_id}")
        crashed: BaseException | None = None
        try:
            async with open_store(s.store.url, s.store) as store:
                resolved = await wait_until_up(
                    lambda: join_fleet(redis_client, s), stop=self._stop, what="reach the fleet's Redis"
                )
                if resolved is None:
                    log.info("stopped before joining the fleet", extra=kv(worker=self.worker_id))
                    return
                self.health.reached()
                self.settings = self._shards.settings = s = resolved
                keys = Keys(s.fleet.name)
                ctx = WorkerContext(
                    settings=s,
                    worker_id=self.worker_id,
                    redis=redis_client,
                    store=store,
                    keys=keys,
                    registry=FleetRegistry(redis_client, keys),
                    admin=AdminPublisher(
                        redis_client,
                        keys,
                        maxlen=s.admin.stream_maxlen,
                        markers_max=s.queue.outcome_markers_max,
                        marker_retention_s=s.queue.ended_retention,
                        durability=s.redis.durable,
                    ),
                    limits=ValidationLimits.from_settings(s.security, fleet=s.fleet.name),
                    inflight=asyncio.Semaphore(s.worker.max_inflight_datasets),
                    # Lock releases heard from other workers at once; its run() task (started
                    # in _work) is the only user of its pub/sub connection.
                    notifier=SharedReleaseNotifier(redis_client, keys.fleet_key("locks")),
                    probe=self._probe,
                    tracer=tracer,
                )
                started = time.time()
                joined = await wait_until_up(
                    lambda: self._join(ctx, started), stop=self._stop, what="register with the fleet"
                )
                if joined is None:
                    log.info("stopped before joining the fleet", extra=kv(worker=self.worker_id))
                    await run_shielded(self._leave(ctx, reason=None))
                    return
                self.health.joined()
                self.ready.set()
                crashed = await self._work(ctx, started)
        finally:
            await run_shielded(_close_within(redis_client, CLOSE_TIMEOUT_S))
            if self._phases.asked is not None and self._phases.drained is not None:
                self._phases.closed = time.monotonic()
                log.info("worker shut down", extra=kv(worker=self.worker_id, **self._phases.seconds()))
        if crashed is not None:
            raise ProcessCrashed(f"worker {self.worker_id} crashed: {crashed!r}") from crashed

    async def _join(self, ctx: WorkerContext, started: float) -> bool | None:
        """Register; return True, or None when stopped first.

        Another live process holding this worker's id (the same ``--id`` given
        twice) would share its owner tokens, which then fence neither: this
        one waits for that lease to expire (a process restarted before its
        predecessor's lease ran out; at once when the predecessor was on this
        host and is gone), and stops with a ConfigError if it does not.

        Raises:
            ConfigError: the id stayed held by another live process for 1.5 leases.
            TransientError: Redis is unavailable (the caller retries).
        """
        s = self.settings.worker
        info = worker_info(self.worker_id, started, self._instance)
        replacing = ""
        deadline: float | None = None
        while (holder := await ctx.registry.register(info, s.lease, replacing=replacing)) is not None:
            if holder.instance != replacing and _gone(holder):
                replacing = holder.instance  # its process ended: take its lease over now
                continue
            now = time.monotonic()
            if deadline is None:
                deadline = now + 1.5 * s.lease
                log.warning(
                    "another live process holds this worker id; waiting for its lease to expire",
                    extra=kv(worker=self.worker_id, host=holder.host, pid=holder.pid),
                )
            elif now > deadline:
                raise ConfigError(
                    f"worker id {self.worker_id!r} is in use by a live worker (host {holder.host},"
                    f" pid {holder.pid}): give each worker process its own --id"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), s.heartbeat)
            if self._stop.is_set():
                return None
        await ctx.emit(
            WorkerJoined(at=time.time(), worker=self.worker_id, host=socket.gethostname(), pid=os.getpid())
        )
        log.info("worker joined", extra=kv(worker=self.worker_id, fleet=self.settings.fleet.name))
        return True

    async def _work(self, ctx: WorkerContext, started: float) -> BaseException | None:
        """Run heartbeat, follower and shards until shutdown or a fatal error; leave; return the error."""
        process = ProcessTasks(
            f"worker {self.worker_id}",
            stop=self._stop,
            on_fatal=self._on_fatal,
            hard_exit_after=self._hard_exit_after,
        )
        left = False
        self._leaving.clear()  # joined (again): the heartbeat keeps the membership from now on
        try:
            async with process:
                process.start(self._heartbeat(ctx.registry, started), "heartbeat")
                process.start(trim_heap_forever(self.settings.worker.malloc_trim_interval), "heap trim")
                if ctx.notifier is not None:
                    process.start(ctx.notifier.run(), "lock release notices")
                follower = process.start(self._follow(ctx, process), "assignment follower")
                await self._stop.wait()
                self.health.stopping()  # a shutdown, or a fatal error: not ready any more
                if self._phases.asked is None:  # a fatal error, not a shutdown
                    self._phases.asked = time.monotonic()
                # Its reconcile steps are safe to interrupt: a shard it had not started yet
                # is simply not started.
                await cancel_until_done(follower)
                if process.crashed is None:
                    await self._stop_all(ctx, process)  # phases 1-3
                else:
                    # Stopped without grace (on_fatal); leave now even if a runner is slow
                    # to end: owner tokens and dataset locks fence it meanwhile.
                    await asyncio.wait(
                        [t for _r, t in self._runners.values()] or [follower], timeout=CRASH_SETTLE_S
                    )
                    left = True
                    await run_shielded(self._leave(ctx, reason="crashed"))
        finally:
            if not left:
                # Phase 4, shielded: a cancelled worker still leaves cleanly.
                await run_shielded(self._leave(ctx, reason="crashed" if process.crashed else "shutdown"))
            self._phases.left = time.monotonic()
        return process.crashed

    def _on_fatal(self) -> None:
        # ProcessTasks cancels every task; asking each runner to stop as well means a
        # cancellation that gets lost (redis-py on 3.11) cannot keep a shard polling.
        self._shards.request_stop_all()

    async def _leave(self, ctx: WorkerContext, *, reason: str | None) -> None:
        """Deregister and publish ``worker_left`` (``reason`` None: deregister only); best effort, bounded."""
        self._leaving.set()
        self.health.left()
        removed: bool | None = None  # None: unknown (Redis failed): announced here, as before
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                removed = await ctx.registry.deregister(self.worker_id)
        except (TransientError, TimeoutError) as exc:
            log.warning(
                "could not deregister; the lease will expire", extra=kv(error=str(exc) or type(exc).__name__)
            )
        if reason is None:
            return
        if removed is False:
            # Not a member any more: the coordinator forgot it when its lease expired, and published that
            # worker_left itself (one departure, one event).
            log.info("worker left", extra=kv(worker=self.worker_id, reason=reason, announced="coordinator"))
            return
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await ctx.emit(WorkerLeft(at=time.time(), worker=self.worker_id, reason=reason))
        except (TransientError, TimeoutError) as exc:
            log.warning(
                "could not publish worker_left", extra=kv(error=str(exc) or type(exc).__name__, reason=reason)
            )
        log.info("worker left", extra=kv(worker=self.worker_id, reason=reason))

    async def _heartbeat(self, registry: FleetRegistry, started: float) -> None:
        s = self.settings.worker
        while True:
            await asyncio.sleep(s.heartbeat)
            if self._leaving.is_set():
                return
            try:
                info = worker_info(self.worker_id, started, self._instance)
                if await registry.renew(info, s.lease):
                    self.health.renewed()
                    continue
                if self._leaving.is_set():
                    # The lease is gone because we deregistered: re-registering here
                    # (a heartbeat whose cancellation was lost) would leave a member
                    # behind that the coordinator later reports as a second worker_left.
                    return
                # We were presumed dead (frozen, or cut off from Redis): our
                # shards may have moved; their owner tokens fence us.
                log.warning("membership lease had expired; re-registering", extra=kv(worker=self.worker_id))
                holder = await registry.register(info, s.lease)
                if holder is not None:
                    # Another process took our id while we were presumed dead: it owns
                    # our shards under the same owner tokens. Stop at once.
                    raise Fenced(
                        f"worker id {self.worker_id!r} was taken by another process (host {holder.host},"
                        f" pid {holder.pid}) while this one was presumed dead; stopping"
                    )
                self.health.renewed()
            except TransientError as exc:
                self.health.heartbeat_failed()
                log.warning("heartbeat failed", extra=kv(error=str(exc)))

    async def _follow(self, ctx: WorkerContext, process: ProcessTasks) -> None:
        """Start and stop shard runners as the assignment says, until shutdown."""
        shards = self.settings.fleet.shards
        while not self._stop.is_set():
            try:
                assignment = await ctx.registry.assignment(shards)
                await self._shards.reconcile(
                    ctx,
                    process,
                    assignment.runnable(self.worker_id),
                    assignment.releasing(self.worker_id),
                    self._stop,
                )
            except TransientError as exc:
                log.warning("cannot read the assignment", extra=kv(error=str(exc)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), FOLLOW_INTERVAL_S)

    async def _stop_all(self, ctx: WorkerContext, process: ProcessTasks) -> None:
        """Phases 1-3: stop intake and drain every runner (``worker.drain_grace``), then hand every
        shard back in one write bounded by :data:`HANDBACK_TIMEOUT_S` (Redis slow or down: the
        coordinator moves the shards once our lease expires instead)."""
        shards = list(self._runners)
        await self._shards.wait_stopped(process)
        self._phases.drained = time.monotonic()
        if process.crashed is None:  # a fatal error while draining: leave without handing back
            try:
                async with asyncio.timeout(HANDBACK_TIMEOUT_S):
                    await ctx.registry.confirm_all_stopped(shards, self.worker_id)
            except (TransientError, TimeoutError) as exc:
                log.warning(
                    "could not hand the shards back; they move when the lease expires",
                    extra=kv(error=str(exc) or type(exc).__name__, shards=len(shards)),
                )
        self._phases.handed_back = time.monotonic()
        self._runners.clear()


async def run_worker(settings: Settings, *, worker_id: str | None = None) -> None:
    """Run a worker until SIGTERM/SIGINT, then shut down in phases.

    Raises:
        ConfigError: bad configuration or a fleet with another shard count.
        ProcessCrashed: an unexpected error (logged with its traceback when it happened).
    """
    import signal

    tune_gc()  # this process is the worker's own
    worker = Worker(settings, worker_id=worker_id, hard_exit_after=HARD_EXIT_AFTER_S)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.shutdown)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    try:
        await worker.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(sig)


async def _close_within(client: redis.asyncio.Redis, timeout: float) -> None:  # noqa: ASYNC109
    """Close ``client``, giving up after ``timeout`` seconds (the process ends anyway)."""
    try:
        async with asyncio.timeout(timeout):
            await client.aclose()
    except TimeoutError:
        log.warning("closing the Redis client timed out", extra=kv(timeout_s=timeout))


def _gone(holder: WorkerInfo) -> bool:
    """Return True when ``holder``'s process is known to have ended: it ran on this host (same
    name) under another pid that no longer exists. Anything else may be alive."""
    if holder.host != socket.gethostname() or holder.pid == os.getpid() or holder.pid <= 0:
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's, say)
        return False
    return False
