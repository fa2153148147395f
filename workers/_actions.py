"""What a shard's owner does for one dataset: commit, abort, recover, clean up a late attempt.

Each body runs under the dataset's storage lock (:meth:`Actions.locked`);
statuses are recorded durably through the shard's ledger
(:meth:`workers._ledger.ShardLedger.set_status`). An operator's ``retry`` /
``skip`` is :mod:`workers._operator_requests`'s, which is given this class's
:meth:`~Actions.locked`, :meth:`~Actions.commit` and :meth:`~Actions.after_commit`.
Each records its span through the worker's tracer (the commit and the abort under
the job's producer span, the lock wait under them; docs/tracing.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from shared import kv
from shared.commit import (
    CommitRequest,
    CommitResult,
    CommitToDelta,
    CommitToTable,
    WinningAttempt,
    abort_dataset,
    cleanup_staged_attempt,
    commit_dataset,
    read_manifest,
    recover_dataset,
    resolve_binding,
    table_step,
)
from shared.events import (
    CommitStarted,
    LockTakenOver,
    Quarantined,
    RecoveryDone,
    StreamBatch,
    lock_name,
)
from shared.locks import HeldLease, StorageLock
from shared.tracing import Attributes

from ._announce import announce_aborted, announce_committed, announce_from_manifest
from ._context import WorkerContext
from ._core import Abort, Action, CleanupAttempt, Commit, Recover, Status
from ._housekeeping import note_quarantine
from ._ledger import ShardLedger

log = logging.getLogger("workers.shard")


class Actions:
    """Commits, aborts, recoveries and clean-ups of a shard's datasets (see the module doc).

    Given the worker's shared handles (``ctx``; its ``probe`` is awaited at
    each named point of the commit path), the shard, and the shard's ledger
    (the job state, where each new status is recorded).
    """

    def __init__(self, ctx: WorkerContext, shard: int, ledger: ShardLedger) -> None:
        self.ctx = ctx
        self.shard = shard
        self._ledger = ledger
        self._probe = ctx.probe

    async def locked(self, dataset: str, body: Callable[[HeldLease], Awaitable[None]]) -> None:
        """Run ``body`` under ``dataset``'s storage lock (announcing a takeover of it first).

        Raises:
            LockTimeout, LockLost: as :meth:`StorageLock.hold`; whatever ``body`` raises.

        Cancellation: the lock is released on the way out (shielded, by the lock).
        """
        ctx = self.ctx
        lock = StorageLock(
            ctx.store,
            lock_name(dataset),
            owner=ctx.worker_id,
            settings=ctx.settings.lock,
            notifier=ctx.notifier,
        )
        tracer = ctx.tracer
        waited = time.time_ns() if tracer.enabled else 0
        async with lock.hold() as lease:
            if tracer.enabled:
                attrs: Attributes = {
                    "commitfleet.dataset": dataset,
                    "commitfleet.epoch": lease.epoch,
                    "commitfleet.took_over": lease.took_over_from is not None,
                }
                tracer.record(
                    "commitfleet.lock_wait", start_ns=waited, end_ns=time.time_ns(), attributes=attrs
                )
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

    async def do(self, work: Action | Recover) -> None:
        """Carry ``work`` out once (the scheduler retries it when this raises).

        Raises:
            Fenced, TransientError, LockTimeout, LockLost, OutcomeUnknown: the work may be tried again.
        """
        if isinstance(work, Commit):
            await self.commit(work)
        elif isinstance(work, Abort):
            await self._abort(work)
        elif isinstance(work, CleanupAttempt):
            await cleanup_staged_attempt(
                self.ctx.store, work.job, work.dataset, work.task, work.attempt, settings=self.ctx.settings
            )
        else:
            await self._recover(work)

    async def commit(self, work: Commit) -> None:
        ctx = self.ctx
        winners = self._ledger.state.winners(work.job, work.dataset)
        if winners is None:
            await self._commit_without_plan(work)
            return
        req = CommitRequest(
            dataset=work.dataset,
            job=work.job,
            winners=[
                WinningAttempt(task=a.task, attempt=a.attempt, files=a.files, watermarks=a.watermarks)
                for a in winners
            ],
            expected_tasks=len(winners),
            stream=self._stream_of(work.job),
            seq=self._fin_of(work.job, work.dataset),
        )
        files = sum(len(a.files) for a in winners)
        size = sum(f.size for a in winners for f in a.files)
        tracer = ctx.tracer
        attrs: Attributes | None = None
        if tracer.enabled:
            attrs = self._span_attributes(work.job, work.dataset)
            attrs.update({"commitfleet.files": files, "commitfleet.bytes": size})
        span = tracer.span("commitfleet.commit", parent=ctx.traces.get(work.job), attributes=attrs)

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
            await self._probe("commit.locked")
            result = await commit_dataset(
                ctx.store, req, lease, ctx.settings, extra_steps=self._table_steps(req), tracer=tracer
            )
            opened.set("commitfleet.status", result.status)
            await self.after_commit(result, lease.epoch)

        with span as opened:
            await self.locked(work.dataset, body)

    def _span_attributes(self, job: str, dataset: str) -> dict[str, str | int | float | bool]:
        return {"commitfleet.job": job, "commitfleet.dataset": dataset, "commitfleet.shard": self.shard}

    def _stream_of(self, job: str) -> StreamBatch | None:
        """The micro-batch a streaming job commits (its ``job_started``), else None."""
        meta = self._ledger.state.jobs.get(job)
        return None if meta is None else meta.stream

    def _fin_of(self, job: str, dataset: str) -> int:
        """The shard's decision sequence of the ``job_finished`` that named ``dataset`` (0: not known)."""
        meta = self._ledger.state.jobs.get(job)
        ds = None if meta is None else meta.datasets.get(dataset)
        return 0 if ds is None else ds.fin

    def _table_steps(self, req: CommitRequest) -> list[CommitToTable | CommitToDelta]:
        """The table step of a bound dataset (the job's binding, else the fleet's), else none."""
        meta = self._ledger.state.jobs.get(req.job)
        binding = resolve_binding(self.ctx.settings, req.dataset, meta.tables if meta is not None else None)
        return [] if binding is None else [table_step(req, binding)]

    async def _commit_without_plan(self, work: Commit) -> None:
        """A commit whose winners the job state lacks: finish it from the store, or say why not.

        The job may have ended meanwhile (a retry after the status was saved:
        nothing to do). Else the store decides: a WAL of the job (an abort
        that found the commit under way) is recovered, a manifest is announced;
        only when neither exists does the dataset stay as it is, with an error.
        """
        if not self._still_committing(work):
            return
        await self._recover(Recover(dataset=work.dataset))
        if not self._still_committing(work):
            return
        if await read_manifest(self.ctx.store, work.dataset, work.job) is not None:
            await announce_from_manifest(self.ctx, work.dataset, work.job, 0)
            await self._ledger.set_status(work.job, work.dataset, "committed")
            return
        log.error("commit scheduled without a complete set of winners", extra=kv(work=repr(work)))

    def _still_committing(self, work: Commit) -> bool:
        """Return True while the job state still has ``work``'s dataset committing or blocked."""
        meta = self._ledger.state.jobs.get(work.job)
        ds = meta.datasets.get(work.dataset) if meta is not None else None
        return ds is not None and ds.status in ("committing", "blocked")

    async def after_commit(self, result: CommitResult, epoch: int) -> None:
        ctx = self.ctx
        status: Status
        reason = result.quarantined or ""
        if result.status == "committed":
            status = "committed"
            await self._probe("commit.done")
            # Also when the commit was found done (``already_committed``): the
            # holder that finished it may have died before announcing it.
            await announce_committed(
                self.ctx,
                result.dataset,
                result.job,
                files=result.files,
                size=result.bytes,
                duration=result.duration,
                epoch=epoch,
                phases=result.phase_seconds,
            )
        elif result.status == "refused":
            # A streaming batch the dataset already holds: rolled back like an abort (docs/streaming.md).
            status = "aborted"
            reason = result.refused or "stream: refused"
            log.warning(
                "streaming batch refused", extra=kv(dataset=result.dataset, job=result.job, reason=reason)
            )
            await announce_aborted(ctx, result.dataset, result.job, reason, result.files_deleted)
        elif result.status == "quarantined":
            status = "quarantined"
            ctx.counters.add("quarantined")
            log.error(
                "commit sequence quarantined: the dataset waits for an operator (retry or skip)",
                extra=kv(dataset=result.dataset, job=result.job, reason=reason),
            )
            # Status, the console and `commitfleet retry` read quarantines from this record:
            # written before the event, so that an operator who acts on the event finds it
            # (a recovery's sequence has no job record to show it).
            await note_quarantine(ctx, self.shard, result.dataset, result.job, reason)
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
            await note_quarantine(ctx, self.shard, result.dataset, result.job, reason)
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
        await self._probe("commit.announced")
        await self._ledger.set_status(result.job, result.dataset, status, reason)
        await self._probe("commit.saved")

    async def _abort(self, work: Abort) -> None:
        ctx = self.ctx
        commit_wins = False
        attrs: Attributes | None = None
        if ctx.tracer.enabled:
            attrs = {**self._span_attributes(work.job, work.dataset), "commitfleet.reason": work.reason[:200]}
        span = ctx.tracer.span("commitfleet.abort", parent=ctx.traces.get(work.job), attributes=attrs)

        async def body(lease: HeldLease) -> None:
            nonlocal commit_wins
            result = await abort_dataset(ctx.store, work.dataset, work.job, lease, ctx.settings)
            opened.set("commitfleet.status", result.status)
            if result.status == "commit_in_progress":
                # A commit that has written its WAL wins over the abort.
                await self._ledger.set_status(work.job, work.dataset, "committing")
                commit_wins = True
                return
            await self._probe("abort.done")
            if result.status == "already_committed":
                await announce_from_manifest(self.ctx, work.dataset, work.job, lease.epoch)
                await self._probe("abort.announced")
                await self._ledger.set_status(work.job, work.dataset, "committed")
                return
            # Redone after a crash, the files are gone already (files_deleted
            # counts what this call deleted); the event is announced once.
            await announce_aborted(self.ctx, work.dataset, work.job, work.reason, result.files_deleted)
            await self._probe("abort.announced")
            await self._ledger.set_status(work.job, work.dataset, "aborted", work.reason)

        with span as opened:
            await self.locked(work.dataset, body)
        if commit_wins:
            await self.commit(Commit(job=work.job, dataset=work.dataset))

    async def _recover(self, work: Recover) -> None:
        ctx = self.ctx

        async def body(lease: HeldLease) -> None:
            recovery = await recover_dataset(ctx.store, work.dataset, lease, ctx.settings, tracer=ctx.tracer)
            for result in recovery.results:
                await self.after_commit(result, lease.epoch)
            if recovery.blocked_by is not None:
                log.warning(
                    "dataset blocked by a quarantined sequence",
                    extra=kv(dataset=work.dataset, job=recovery.blocked_by, reason=recovery.reason),
                )

        attrs: Attributes = {"commitfleet.dataset": work.dataset, "commitfleet.shard": self.shard}
        with ctx.tracer.span("commitfleet.recover", attributes=attrs):
            await self.locked(work.dataset, body)


__all__ = ["Actions"]
