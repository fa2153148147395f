"""One shard, run by its owner: intake, job state, commits, aborts, recovery.

A :class:`ShardRunner` runs while the worker owns the shard. Its life:

1. Session start: read the shard's owner token (must name us), load the
   shard's job state from Redis, take over the pending entries of every
   other consumer of the shard's group (the two-step handoff guarantees they
   stopped: they confirmed, or their lease expired), re-schedule the commits
   and aborts that were under way, and recover every unfinished commit
   sequence in ``_wal/`` of the shard's datasets.
2. Intake: our own pending entries first, then new ones, in batches. Each
   entry is decoded and validated (a bad one goes to the dead-letter stream
   with its reason, and never stops the shard), folded into the job state
   (``_jobstate.decide``) and made durable together with its
   acknowledgement (``ShardStateStore.save``). Only then do its actions run.
3. Actions (commit / abort / clean up a late attempt) run as tasks owned by
   the runner, bounded by the worker-wide in-flight semaphore (intake waits
   for a free slot: back-pressure, not unbounded memory), one at a time per
   dataset, each under the dataset's storage lock.
4. Stop (shard taken away or worker draining): intake stops, in-flight
   actions get ``drain_grace`` seconds to finish, then are cancelled (their
   locks are released on the way out; an interrupted commit stays in the WAL
   for the next owner to recover).

A transient Redis error restarts the session (state reloaded, pending
re-read); losing the owner token (:class:`~shared.Fenced`) ends the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

from shared import (
    BadInput,
    CommitfleetError,
    Fenced,
    LockLost,
    LockTimeout,
    NotFound,
    OutcomeUnknown,
    TransientError,
)
from shared._aio import cancel_until_done
from shared._logging import kv
from shared.commit import (
    CommitRequest,
    CommitResult,
    CommitStepFailed,
    WinningAttempt,
    abort_dataset,
    cleanup_staged_attempt,
    commit_dataset,
    list_unfinished,
    recover_dataset,
    retry_quarantined,
    skip_quarantined,
)
from shared.events import (
    Aborted,
    CommitStarted,
    Committed,
    InvalidMessage,
    JobTimedOut,
    LockTakenOver,
    MessageRejected,
    OperatorAction,
    Quarantined,
    QueueEvent,
    RecoveryDone,
    decode_entry,
    event_datasets,
    lock_name,
    restrict_to,
)
from shared.locks import HeldLease, StorageLock
from shared.queue import Entry, ShardConsumer, as_text, redis_errors, shard_of

from ._context import WorkerContext
from ._jobstate import (
    Abort,
    Action,
    CleanupAttempt,
    Commit,
    ShardJobs,
    Status,
    decide,
)
from ._state_store import Batch, ShardStateStore, attempt_fields

log = logging.getLogger("workers.shard")

# Ended jobs are remembered this long, to drop (and clean up after) late events.
ENDED_RETENTION_S = 7 * 86400
# How often the runner looks at timeouts, operator requests and retention.
TICK_S = 1.0


class Recover(msgspec.Struct, frozen=True, kw_only=True):
    """Finish an unfinished commit sequence found in ``_wal/`` (no job state needed)."""

    dataset: str


class Operate(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's ``retry`` or ``skip`` of a quarantined sequence (``op`` as requested)."""

    dataset: str
    job: str
    op: str


Work = Action | Recover | Operate


def _work_key(w: Work) -> tuple[object, ...]:
    if isinstance(w, CleanupAttempt):
        return ("cleanup", w.job, w.dataset, w.task, w.attempt)
    if isinstance(w, Recover):
        return ("recover", w.dataset)
    return (type(w).__name__, w.job, w.dataset)


def _dataset_of(w: Work) -> str:
    return w.dataset


class ShardRunner:
    """Runs one shard for as long as the worker owns it (see the module doc)."""

    def __init__(self, ctx: WorkerContext, shard: int) -> None:
        self.ctx = ctx
        self.shard = shard
        self.stopping = asyncio.Event()
        self.state = ShardJobs()
        self.store: ShardStateStore | None = None
        self._running: set[tuple[object, ...]] = set()
        self._ds_locks: dict[str, asyncio.Lock] = {}
        self._save_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_tick = 0.0
        self._consumer = ShardConsumer(
            ctx.redis, ctx.keys, shard, consumer=ctx.worker_id, max_copy_bytes=64 * 1024
        )

    def request_stop(self) -> None:
        """Ask the runner to stop intake and drain (idempotent)."""
        self.stopping.set()

    # -- life ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the shard until :meth:`request_stop`; then drain in-flight work.

        Raises:
            Fenced: another worker owns the shard now (nothing more was written).

        Cancellation: in-flight actions are cancelled with it; each releases its
        lock shielded, and an interrupted commit stays in the WAL for recovery.
        """
        delay = 0.1
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                while not self.stopping.is_set():
                    try:
                        await self._session()
                        delay = 0.1
                    except TransientError as exc:
                        log.warning(
                            "shard session interrupted, restarting",
                            extra=kv(shard=self.shard, error=str(exc), retry_in=round(delay, 2)),
                        )
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self.stopping.wait(), delay)
                        delay = min(delay * 2, 5.0)
                await self._drain()
        except* Fenced as eg:
            raise eg.exceptions[0] from None
        except* CommitfleetError as eg:
            raise eg.exceptions[0] from None

    async def _drain(self) -> None:
        """Give in-flight actions ``drain_grace`` seconds, then cancel what is left."""
        pending = [t for t in self._tasks if not t.done()]
        if not pending:
            return
        log.info("draining shard", extra=kv(shard=self.shard, in_flight=len(pending)))
        _done, late = await asyncio.wait(pending, timeout=self.ctx.settings.worker.drain_grace)
        # Each releases its lock on the way out; its WAL stays for the next owner.
        await asyncio.gather(*(cancel_until_done(t) for t in late))

    async def _session(self) -> None:
        ctx = self.ctx
        token = await ctx.registry.owner_token(self.shard)
        if token is None or not token.decode().startswith(f"{ctx.worker_id}@"):
            raise Fenced(f"shard {self.shard} owner token is {token!r}, not ours")
        self.store = ShardStateStore(ctx.redis, ctx.keys, self.shard, token)
        self.state = await self.store.load()
        await self._consumer.ensure_group()
        await self._claim_others(forget_idle=True)
        await self._resume_work()
        after = b"0"
        while not self.stopping.is_set():
            entries = await self._consumer.read_pending(ctx.settings.worker.read_batch, after)
            if not entries:
                break
            await self._process(entries)
            after = entries[-1].id
        while not self.stopping.is_set():
            await self._wait_capacity()
            entries = await self._consumer.read(
                ctx.settings.worker.read_batch, ctx.settings.worker.read_block_ms
            )
            if entries:
                await self._process(entries)
            if time.monotonic() - self._last_tick >= TICK_S:
                self._last_tick = time.monotonic()
                await self._tick()

    async def _claim_others(self, *, forget_idle: bool = False) -> list[Entry]:
        """Take over the entries pending to any other consumer of the shard's group.

        We hold the shard's owner token, so every other consumer is a previous
        owner that stopped (it confirmed, or its lease expired). A frozen one
        that wakes up can still read a batch before it notices it was fenced:
        those entries become pending to it, and this (called at session start
        and on every tick) brings them back.
        """
        others = [
            c.name for c in await self._consumer.consumers() if c.name != self.ctx.worker_id and c.pending
        ]
        if not others:
            return []
        claimed = await self._consumer.claim_from(others)
        log.info(
            "took over pending entries", extra=kv(shard=self.shard, consumers=others, entries=len(claimed))
        )
        return claimed

    async def _wait_capacity(self) -> None:
        # Back-pressure: no new intake while every in-flight slot is taken.
        if self.ctx.inflight.locked():
            await self.ctx.inflight.acquire()
            self.ctx.inflight.release()

    # -- intake -------------------------------------------------------------------------

    def _mine(self, ev: QueueEvent) -> QueueEvent:
        """Return ``ev`` restricted to this shard's datasets; raise InvalidMessage if none."""
        shards = self.ctx.settings.fleet.shards
        names = event_datasets(ev)
        mine = {d for d in names if shard_of(d, shards) == self.shard}
        if not mine:
            where = sorted({shard_of(d, shards) for d in names})
            raise InvalidMessage(
                "inconsistent", f"datasets {names} belong to shards {where}, not {self.shard}"
            )
        return ev if len(mine) == len(names) else restrict_to(ev, mine)

    async def _process(self, entries: list[Entry]) -> None:
        ctx = self.ctx
        now = time.time()
        batch = Batch()
        todo: list[Action] = []
        rejected = 0
        for entry in entries:
            if entry.deleted:
                # Trimmed while pending: nothing left to read.
                await self._reject(entry, InvalidMessage("schema", "entry was trimmed from the stream"))
                rejected += 1
                continue
            try:
                ev = self._mine(decode_entry(entry.fields, limits=ctx.limits))
            except InvalidMessage as exc:
                await self._reject(entry, exc)
                rejected += 1
                continue
            d = decide(self.state, ev, now=now, default_timeout=ctx.settings.worker.job_timeout)
            if d.replayed:
                await self._reject(entry, InvalidMessage("replayed", d.note))
                rejected += 1
                continue
            self.state.apply(d)
            if d.job is not None:
                batch.jobs.add(d.job.job)
            if d.attempt is not None and d.job is not None:
                ds, rec = d.attempt
                batch.attempts[(d.job.job, ds, rec.task, rec.attempt)] = rec
            todo.extend(d.actions)
            batch.ack.append(entry.id)
        await self._save(batch)
        ctx.counters.add("intake", len(entries))
        if rejected:
            ctx.counters.add("rejected", rejected)
        for action in todo:
            await self._schedule(action)

    async def _reject(self, entry: Entry, exc: InvalidMessage) -> None:
        dead_id = await self._consumer.dead_letter(entry, exc.reason, exc.detail)
        log.warning(
            "message rejected",
            extra=kv(shard=self.shard, id=entry.id.decode(), reason=exc.reason, detail=exc.detail),
        )
        if dead_id is not None:
            await self.ctx.emit(
                MessageRejected(
                    at=time.time(),
                    worker=self.ctx.worker_id,
                    shard=self.shard,
                    reason=exc.reason,
                    detail=exc.detail[:500],
                    stream_id=entry.id.decode(),
                )
            )

    async def _save(self, batch: Batch) -> None:
        assert self.store is not None
        async with self._save_lock:
            await self.store.save(batch, self.state)

    # -- background checks ----------------------------------------------------------------

    async def _tick(self) -> None:
        claimed = await self._claim_others()
        if claimed:
            await self._process(claimed)
        now = time.time()
        for abort in self.state.expired(now):
            meta = self.state.set_status(abort.job, abort.dataset, "aborting", abort.reason)
            if meta is None:
                continue
            self.state.jobs[abort.job] = meta
            await self._save(Batch(jobs={abort.job}))
            await self.ctx.emit(
                JobTimedOut(at=now, worker=self.ctx.worker_id, job=abort.job, datasets=[abort.dataset])
            )
            await self._schedule(abort)
        for op in await self._operator_requests():
            await self._schedule(op)
        old = [job for job, e in self.state.ended.items() if e.at < now - ENDED_RETENTION_S]
        if old:
            assert self.store is not None
            await self.store.forget_ended(old)
            for job in old:
                del self.state.ended[job]
        await self.ctx.flush_counters()

    async def _operator_requests(self) -> list[Operate]:
        key = self.ctx.keys.shard_state(self.shard, "operator")
        with redis_errors("read operator requests"):
            raw = await self.ctx.redis.hgetall(key)
        out: list[Operate] = []
        for field, op in raw.items():
            dataset, _, job = as_text(field).partition("/")
            out.append(Operate(dataset=dataset, job=job, op=as_text(op)))
        return out

    async def _resume_work(self) -> None:
        """Re-schedule what was under way when the shard last changed hands."""
        for meta in list(self.state.jobs.values()):
            for name, ds in meta.datasets.items():
                if ds.status in ("committing", "blocked"):
                    await self._schedule(Commit(job=meta.job, dataset=name))
                elif ds.status == "aborting":
                    await self._schedule(Abort(job=meta.job, dataset=name, reason=ds.reason or "aborted"))
        shards = self.ctx.settings.fleet.shards
        tracked = {
            (name, meta.job)
            for meta in self.state.jobs.values()
            for name, ds in meta.datasets.items()
            if ds.status in ("committing", "blocked")
        }
        seen: set[str] = set()
        for seq in await list_unfinished(self.ctx.store):
            if shard_of(seq.dataset, shards) != self.shard or seq.dataset in seen:
                continue
            if (seq.dataset, seq.job) in tracked or seq.quarantined is not None:
                continue
            seen.add(seq.dataset)
            await self._schedule(Recover(dataset=seq.dataset))

    # -- actions --------------------------------------------------------------------------

    async def _schedule(self, work: Work) -> None:
        key = _work_key(work)
        if key in self._running:
            return
        await self.ctx.inflight.acquire()
        self._running.add(key)
        task = self._tg.create_task(self._run_work(work, key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_work(self, work: Work, key: tuple[object, ...]) -> None:
        try:
            lock = self._ds_locks.setdefault(_dataset_of(work), asyncio.Lock())
            async with lock:
                await self._retrying(work)
        finally:
            self._running.discard(key)
            self.ctx.inflight.release()

    async def _retrying(self, work: Work) -> None:
        """Run ``work`` until it is done, the shard stops, or another worker owns the shard."""
        delay = 0.2
        while True:
            try:
                await self._do(work)
                return
            except Fenced:
                raise
            except (TransientError, LockTimeout, LockLost, OutcomeUnknown) as exc:
                if self.stopping.is_set():
                    log.info("leaving work to the next owner", extra=kv(work=repr(work), error=str(exc)))
                    return
                log.warning("work interrupted, retrying", extra=kv(work=repr(work), error=str(exc)))
            except CommitfleetError as exc:
                # Not expected here (the commit core quarantines what keeps
                # failing); keep the dataset waiting, never stop the shard.
                log.exception("work failed, retrying later", extra=kv(work=repr(work), error=repr(exc)))
                delay = max(delay, 5.0)
            if self.stopping.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
            delay = min(delay * 2, 30.0)

    async def _locked(self, dataset: str, body: Callable[[HeldLease], Awaitable[None]]) -> None:
        ctx = self.ctx
        lock = StorageLock(ctx.store, lock_name(dataset), owner=ctx.worker_id, settings=ctx.settings.lock)
        async with lock.hold() as lease:
            if lease.took_over_from is not None:
                ctx.counters.add("lock_takeovers")
                await ctx.emit(
                    LockTakenOver(
                        at=time.time(),
                        worker=ctx.worker_id,
                        dataset=dataset,
                        previous_owner=lease.took_over_from,
                        epoch=lease.epoch,
                    )
                )
            await body(lease)

    async def _do(self, work: Work) -> None:
        if isinstance(work, Commit):
            await self._commit(work)
        elif isinstance(work, Abort):
            await self._abort(work)
        elif isinstance(work, CleanupAttempt):
            await cleanup_staged_attempt(
                self.ctx.store, work.job, work.dataset, work.task, work.attempt, settings=self.ctx.settings
            )
        elif isinstance(work, Recover):
            await self._recover(work)
        else:
            await self._operate(work)

    async def _commit(self, work: Commit) -> None:
        ctx = self.ctx
        winners = self.state.winners(work.job, work.dataset)
        if winners is None:
            log.error("commit scheduled without a complete set of winners", extra=kv(work=repr(work)))
            return
        req = CommitRequest(
            dataset=work.dataset,
            job=work.job,
            winners=[
                WinningAttempt(task=a.task, attempt=a.attempt, files=a.files, watermarks=a.watermarks)
                for a in winners
            ],
            expected_tasks=len(winners),
        )
        files = sum(len(a.files) for a in winners)
        size = sum(f.size for a in winners for f in a.files)

        async def body(lease: HeldLease) -> None:
            await ctx.emit(
                CommitStarted(
                    at=time.time(),
                    worker=ctx.worker_id,
                    dataset=work.dataset,
                    job=work.job,
                    files=files,
                    bytes=size,
                    epoch=lease.epoch,
                )
            )
            result = await commit_dataset(ctx.store, req, lease, ctx.settings)
            await self._after_commit(result, lease.epoch)

        await self._locked(work.dataset, body)

    async def _after_commit(self, result: CommitResult, epoch: int) -> None:
        ctx = self.ctx
        status: Status
        reason = result.quarantined or ""
        if result.status == "committed":
            status = "committed"
            ctx.counters.add("committed")
            if not result.already_committed:
                await ctx.emit(
                    Committed(
                        at=time.time(),
                        worker=ctx.worker_id,
                        dataset=result.dataset,
                        job=result.job,
                        files=result.files,
                        bytes=result.bytes,
                        duration_s=result.duration,
                        epoch=epoch,
                        phases=result.phase_seconds,
                    )
                )
        elif result.status == "quarantined":
            status = "quarantined"
            ctx.counters.add("quarantined")
            log.error(
                "commit sequence quarantined: the dataset waits for an operator (retry or skip)",
                extra=kv(dataset=result.dataset, job=result.job, reason=reason),
            )
            await ctx.emit(
                Quarantined(
                    at=time.time(),
                    worker=ctx.worker_id,
                    dataset=result.dataset,
                    job=result.job,
                    reason=reason,
                    attempts=result.attempts,
                )
            )
        elif result.blocked_by == result.job:
            # This very sequence was quarantined before (a replay after a
            # restart): it stays quarantined, and was announced back then.
            status = "quarantined"
        else:
            status = "blocked"
            reason = f"blocked by quarantined job {result.blocked_by}: {reason}"
            log.warning("commit blocked", extra=kv(dataset=result.dataset, job=result.job, reason=reason))
        if result.recovered:
            await ctx.emit(
                RecoveryDone(
                    at=time.time(),
                    worker=ctx.worker_id,
                    dataset=result.dataset,
                    job=result.job,
                    steps_redone=result.steps_redone,
                    duration_s=result.duration,
                )
            )
        await self._set_status(result.job, result.dataset, status, reason)

    async def _abort(self, work: Abort) -> None:
        ctx = self.ctx
        commit_wins = False

        async def body(lease: HeldLease) -> None:
            nonlocal commit_wins
            result = await abort_dataset(ctx.store, work.dataset, work.job, lease, ctx.settings)
            if result.status == "commit_in_progress":
                # A commit that has written its WAL wins over the abort.
                await self._set_status(work.job, work.dataset, "committing")
                commit_wins = True
                return
            if result.status == "already_committed":
                await self._set_status(work.job, work.dataset, "committed")
                return
            ctx.counters.add("aborted")
            await ctx.emit(
                Aborted(
                    at=time.time(),
                    worker=ctx.worker_id,
                    dataset=work.dataset,
                    job=work.job,
                    reason=work.reason,
                    files_deleted=result.files_deleted,
                )
            )
            await self._set_status(work.job, work.dataset, "aborted", work.reason)

        await self._locked(work.dataset, body)
        if commit_wins:
            await self._commit(Commit(job=work.job, dataset=work.dataset))

    async def _recover(self, work: Recover) -> None:
        ctx = self.ctx

        async def body(lease: HeldLease) -> None:
            recovery = await recover_dataset(ctx.store, work.dataset, lease, ctx.settings)
            for result in recovery.results:
                await self._after_commit(result, lease.epoch)
            if recovery.blocked_by is not None:
                log.warning(
                    "dataset blocked by a quarantined sequence",
                    extra=kv(dataset=work.dataset, job=recovery.blocked_by, reason=recovery.reason),
                )

        await self._locked(work.dataset, body)

    async def _operate(self, work: Operate) -> None:
        ctx = self.ctx
        key = ctx.keys.shard_state(self.shard, "operator")

        async def body(lease: HeldLease) -> None:
            action: Literal["retry", "skip"]
            if work.op == "retry":
                action = "retry"
                result = await retry_quarantined(ctx.store, work.dataset, work.job, lease, ctx.settings)
                await self._after_commit(result, lease.epoch)
            else:
                action = "skip"
                await skip_quarantined(ctx.store, work.dataset, work.job, lease, ctx.settings)
                await self._set_status(work.job, work.dataset, "aborted", "skipped by operator")
            await ctx.emit(
                OperatorAction(
                    at=time.time(), worker=ctx.worker_id, dataset=work.dataset, job=work.job, action=action
                )
            )

        if work.op in ("retry", "skip"):
            try:
                await self._locked(work.dataset, body)
            except (BadInput, NotFound, CommitStepFailed) as exc:
                # The request cannot apply (and never will): say so once, drop it.
                log.warning(
                    "operator request refused",
                    extra=kv(op=work.op, dataset=work.dataset, job=work.job, reason=str(exc)),
                )
                await ctx.emit(
                    OperatorAction(
                        at=time.time(),
                        worker=ctx.worker_id,
                        dataset=work.dataset,
                        job=work.job,
                        action="retry" if work.op == "retry" else "skip",
                        outcome="refused",
                        detail=str(exc)[:500],
                    )
                )
        else:
            log.error("unknown operator request", extra=kv(op=work.op, dataset=work.dataset))
        with redis_errors("HDEL operator request"):
            await ctx.redis.hdel(key, f"{work.dataset}/{work.job}")
        # A dataset blocked behind the quarantined sequence can go on now (in
        # this task: it already holds an in-flight slot and the dataset's turn).
        for meta in list(self.state.jobs.values()):
            ds = meta.datasets.get(work.dataset)
            if ds is not None and ds.status == "blocked":
                await self._commit(Commit(job=meta.job, dataset=work.dataset))

    async def _set_status(self, job: str, dataset: str, status: Status, reason: str = "") -> None:
        """Record a dataset's new status durably; end the job when all its datasets are done."""
        meta = self.state.set_status(job, dataset, status, reason)
        if meta is None:
            return
        self.state.jobs[job] = meta
        batch = Batch(jobs={job})
        done = self.state.job_done(job)
        if done is not None:
            batch.drop_attempts.extend(attempt_fields(self.state, job))
            self.state.end_job(job, done, time.time())
            batch.jobs.discard(job)
            batch.ended.add(job)
        await self._save(batch)


__all__ = ["ShardRunner"]
