"""The coordinator process: leader election, shard assignment, the admin API.

Several coordinators may run; one leads. Leadership is the storage lock
``_coordinator`` in the fleet's object store (the same lock as the datasets',
so its fencing epoch travels into every assignment as ``leader_epoch``).
Standbys keep trying to acquire it and serve the admin API meanwhile (status
is read from Redis, so any coordinator answers the same).

The leader, every ``coordinator.tick`` seconds:

1. reads membership (live workers, expired ones), the assignment in force and
   the handoff confirmations;
2. computes the next assignment (:func:`shared.fleet.rebalance`: balanced,
   sticky, two-step moves) and writes it by compare-and-swap on its epoch (a
   deposed leader's write fails);
3. sets each active shard's owner token to its owner (this fences the shard's
   previous owner out of the shard's Redis state), clears completed handoffs,
   forgets expired workers, and publishes ``shards_assigned`` / ``worker_left``.

Start: while Redis cannot be reached the coordinator waits and tries again
with a capped, jittered backoff, logging each wait (SIGTERM ends the wait at
once, exit 0). The shard count comes from the fleet's record in Redis; a
``fleet.shards`` that disagrees is a ConfigError (exit 2), like an admin API
address that cannot be bound.

Shutdown (SIGTERM; safe twice): stop leading (the lock is released, so a
standby takes over at once), stop the HTTP server, close clients.

Crash: an unexpected exception in the election/leading loop or the admin event
aggregator is fatal (:class:`~shared.fleet.ProcessTasks`): its traceback is
logged at once, everything is cancelled (the leader lock is released on the
way out, shielded), and :meth:`Coordinator.run` raises
:class:`~shared.fleet.ProcessCrashed` (exit 70); a process that has not ended
a few seconds later is ended anyway. An error in one HTTP request is that
request's (a 500 answer, logged), not the process's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import redis.asyncio

from shared import ConfigError, LockLost, OutcomeUnknown, Settings, TransientError, kv, run_shielded
from shared.events import ShardsAssigned, WorkerLeft
from shared.fleet import (
    HARD_EXIT_AFTER_S,
    Assignment,
    FleetRegistry,
    ProcessCrashed,
    ProcessTasks,
    dump_tasks,
    moved_count,
    new_worker_id,
    rebalance,
    wait_until_up,
)
from shared.locks import HeldLease, StorageLock
from shared.queue import AdminPublisher, Keys, connect, join_fleet
from shared.storage import ObjectStore, open_store

from .admin import AdminServer

log = logging.getLogger("coordinator")

LEADER_LOCK = "_coordinator"


class Coordinator:
    """One coordinator process (see the module doc)."""

    def __init__(
        self, settings: Settings, *, coordinator_id: str | None = None, hard_exit_after: float | None = None
    ) -> None:
        """Prepare; nothing connects until :meth:`run`.

        ``hard_exit_after``: after a fatal error, end the OS process that many
        seconds later if it is still alive (set by :func:`run_coordinator`).

        Raises:
            ConfigError: no store URL (the leader lock lives in the store).
        """
        if not settings.store.url:
            raise ConfigError("store.url is required (set COMMITFLEET_STORE or store.url in the config file)")
        self.settings = settings
        self.id = new_worker_id(coordinator_id or f"coord-{new_worker_id()}")
        self._stop = asyncio.Event()
        self.leading = asyncio.Event()
        self.http_port: int | None = None
        self.ready = asyncio.Event()
        self._hard_exit_after = hard_exit_after

    def shutdown(self) -> None:
        """Begin shutdown (idempotent)."""
        self._stop.set()

    async def run(self) -> None:
        """Serve the admin API and lead when elected, until :meth:`shutdown`.

        Returns without starting when shut down while waiting for Redis.

        Raises:
            ConfigError: ``fleet.shards`` disagrees with the fleet's record, or
                the HTTP port is taken.
            ProcessCrashed: an unexpected error (its traceback was logged when
                it happened).
        """
        s = self.settings
        r = connect(s.redis, client_name=f"commitfleet-coordinator-{self.id}")
        crashed: BaseException | None = None
        try:
            async with open_store(s.store.url, s.store) as store:
                resolved = await wait_until_up(
                    lambda: join_fleet(r, s), stop=self._stop, what="reach the fleet's Redis"
                )
                if resolved is None:
                    log.info("stopped before starting", extra=kv(coordinator=self.id))
                    return
                self.settings = s = resolved
                keys = Keys(s.fleet.name)
                registry = FleetRegistry(r, keys)
                admin = AdminPublisher(
                    r,
                    keys,
                    maxlen=s.admin.stream_maxlen,
                    durability=s.redis.durable,
                )
                server = AdminServer(s, r, keys, coordinator_id=self.id, leading=self.leading, store=store)
                await server.start()
                self.http_port = server.port
                self.ready.set()
                log.info(
                    "coordinator up",
                    extra=kv(coordinator=self.id, http=f"{s.coordinator.http_host}:{server.port}"),
                )
                process = ProcessTasks(
                    f"coordinator {self.id}", stop=self._stop, hard_exit_after=self._hard_exit_after
                )
                try:
                    async with process:
                        process.start(server.follow_admin(), "admin event aggregator")
                        campaign = process.start(self._campaign(store, registry, admin, r), "leader election")
                        await self._stop.wait()
                        if process.crashed is None:
                            # It ends by itself once stopped, releasing the leader lock.
                            await asyncio.wait([campaign])
                finally:
                    await run_shielded(server.stop())
                crashed = process.crashed
        finally:
            await run_shielded(r.aclose())
        if crashed is not None:
            raise ProcessCrashed(f"coordinator {self.id} crashed: {crashed!r}") from crashed

    async def _campaign(
        self, store: ObjectStore, registry: FleetRegistry, admin: AdminPublisher, r: redis.asyncio.Redis
    ) -> None:
        lock = StorageLock(store, LEADER_LOCK, owner=self.id, settings=self.settings.lock)
        while not self._stop.is_set():
            lease = await self._try_lead(lock)
            if lease is None:
                continue
            try:
                async with lease:
                    self.leading.set()
                    log.info("leading", extra=kv(coordinator=self.id, epoch=lease.epoch))
                    await self._lead(lease, registry, admin)
            except LockLost as exc:
                log.warning("lost leadership", extra=kv(coordinator=self.id, error=str(exc)))
            except TransientError as exc:
                log.warning("leader step failed; campaigning again", extra=kv(error=str(exc)))
            finally:
                self.leading.clear()

    async def _try_lead(self, lock: StorageLock) -> HeldLease | None:
        try:
            lease = await lock.try_acquire()
        except (TransientError, OutcomeUnknown) as exc:
            log.warning("cannot reach the store for the leader lock", extra=kv(error=str(exc)))
            lease = None
        if lease is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.settings.lock.poll_max)
        return lease

    async def _lead(self, lease: HeldLease, registry: FleetRegistry, admin: AdminPublisher) -> None:
        shards = self.settings.fleet.shards
        tick = self.settings.coordinator.tick
        while not self._stop.is_set():
            try:
                await self._step(lease, registry, admin, shards)
            except TransientError as exc:
                log.warning("rebalance step failed", extra=kv(error=str(exc)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), tick)

    async def _step(
        self, lease: HeldLease, registry: FleetRegistry, admin: AdminPublisher, shards: int
    ) -> None:
        live, dead = await registry.members()
        current = await registry.assignment(shards)
        confirmed = await registry.confirmations()
        new = rebalance(current, live.keys(), confirmed, leader_epoch=lease.epoch)
        lease.check()
        if new is not current:
            if not await registry.replace_assignment(current, new):
                log.warning("assignment changed under us; will re-read", extra=kv(epoch=current.epoch))
                return
            moved = moved_count(current, new)
            log.info("assignment published", extra=kv(epoch=new.epoch, moved=moved, workers=sorted(live)))
            await admin.publish(
                ShardsAssigned(
                    at=time.time(), worker=self.id, epoch=new.epoch, assignment=new.owners(), moved=moved
                )
            )
        await self._sync_tokens(registry, new, lease)
        done = [s for s, w in confirmed.items() if new.slots[s].owner != w or new.slots[s].moving_to is None]
        await registry.clear_confirmations(done)
        owners = {s.owner for s in new.slots} | {s.moving_to for s in new.slots}
        gone = {w for w in dead if w not in owners}
        if gone:
            # Only those still expired: one may have re-registered since members() read it.
            for w in sorted(await registry.forget(gone)):
                await admin.publish(WorkerLeft(at=time.time(), worker=w, reason="lease_expired"))
        await registry.set_leader(self.id, self.settings.lock.validity)

    async def _sync_tokens(self, registry: FleetRegistry, a: Assignment, lease: HeldLease) -> None:
        """Make every active shard's owner token name its owner (fencing the previous one)."""
        tokens = await registry.owner_tokens(len(a.slots))
        for shard, (slot, token) in enumerate(zip(a.slots, tokens, strict=True)):
            if slot.owner is None or slot.moving_to is not None:
                continue
            holder = token.decode().rsplit("@", 1)[0] if token else None
            if holder != slot.owner:
                lease.check()
                await registry.set_owner_token(shard, slot.owner, a.epoch)


async def run_coordinator(settings: Settings, *, coordinator_id: str | None = None) -> None:
    """Run a coordinator until SIGTERM/SIGINT.

    Raises:
        ConfigError: bad configuration.
        ProcessCrashed: an unexpected error (logged with its traceback when it happened).
    """
    import signal

    coordinator = Coordinator(settings, coordinator_id=coordinator_id, hard_exit_after=HARD_EXIT_AFTER_S)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, coordinator.shutdown)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    try:
        await coordinator.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(sig)
