"""What a shard's owner does for one dataset: commit, abort, recover, clean up a late attempt.

Each body runs under the dataset's storage lock; statuses are recorded
durably through the runner's state store. Mixed into
:class:`workers._shard.ShardRunner`. An operator's ``retry`` / ``skip``
(:class:`~workers._operator_requests.Operate`) is dispatched from here to
:mod:`workers._operator_requests`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from shared._logging import kv
from shared.commit import (
    CommitRequest,
    CommitResult,
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
    lock_name,
    manifest_key,
)
from shared.locks import HeldLease, StorageLock
from shared.queue import DatasetResult

from ._announce import announce_aborted, announce_committed, announce_from_manifest
from ._context import WorkerContext
from ._housekeeping import note_quarantine
from ._jobstate import (
    Abort,
    Action,
    CleanupAttempt,
    Commit,
    Ended,
    ShardJobs,
    Status,
)
from ._operator_requests import Operate
from ._state_store import Batch, ShardStateStore, attempt_fields

log = logging.getLogger("workers.shard")


async def checkpoint(point: str) -> None:
    """Mark a named point of the commit / abort path; does nothing.

    A test seam: the crash-at-every-point test replaces it to stop a worker
    exactly there (``commit.locked``, ``commit.done``, ``commit.announced``,
    ``commit.saved``, ``abort.done``, ``abort.announced``). Returns None; never raises.
    """
    del point


class Recover(msgspec.Struct, frozen=True, kw_only=True):
    """Finish an unfinished commit sequence found in ``_wal/`` (no job state needed)."""

    dataset: str


Work = Action | Recover | Operate


def work_key(w: Work) -> tuple[object, ...]:
    if isinstance(w, CleanupAttempt):
        return ("cleanup", w.job, w.dataset, w.task, w.attempt)
    if isinstance(w, Recover):
        return ("recover", w.dataset)
    return (type(w).__name__, w.job, w.dataset)


class ActionsMixin:
    """The action half of a shard runner."""

    ctx: WorkerContext
    shard: int
    state: ShardJobs
    store: ShardStateStore | None
    stopping: asyncio.Event
    _save_lock: asyncio.Lock

    async def _save(self, batch: Batch) -> None:
        raise NotImplementedError

    async def _save_change(
        self, job: str, change: Callable[[], Batch | None], saved: Callable[[], None] | None = None
    ) -> None:
        raise NotImplementedError

    if TYPE_CHECKING:
        # Provided by OperatorRequestsMixin (declared for type checking only: a placeholder
        # here would hide it, as ShardRunner lists this mixin before that one).
        async def _operate(self, work: Operate) -> None: ...

    async def _locked(self, dataset: str, body: Callable[[HeldLease], Awaitable[None]]) -> None:
        ctx = self.ctx
        lock = StorageLock(
            ctx.store,
            lock_name(dataset),
            owner=ctx.worker_id,
            settings=ctx.settings.lock,
            notifier=ctx.notifier,
        )
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
            await checkpoint("commit.locked")
            result = await commit_dataset(
                ctx.store, req, lease, ctx.settings, extra_steps=self._table_steps(req)
            )
            await self._after_commit(result, lease.epoch)

        await self._locked(work.dataset, body)

    def _table_steps(self, req: CommitRequest) -> list[CommitToTable]:
        """The table step of a bound dataset (the job's binding, else the fleet's), else none."""
        meta = self.state.jobs.get(req.job)
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
            await self._set_status(work.job, work.dataset, "committed")
            return
        log.error("commit scheduled without a complete set of winners", extra=kv(work=repr(work)))

    def _still_committing(self, work: Commit) -> bool:
        """Return True while the job state still has ``work``'s dataset committing or blocked."""
        meta = self.state.jobs.get(work.job)
        ds = meta.datasets.get(work.dataset) if meta is not None else None
        return ds is not None and ds.status in ("committing", "blocked")

    async def _after_commit(self, result: CommitResult, epoch: int) -> None:
        ctx = self.ctx
        status: Status
        reason = result.quarantined or ""
        if result.status == "committed":
            status = "committed"
            await checkpoint("commit.done")
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
        if status == "quarantined":
            # Status reads quarantines from this record: keep it current now (a recovery's
            # sequence has no job record to show it), not at the next session start.
            await note_quarantine(ctx, self.shard, result.dataset, result.job, reason)
        await checkpoint("commit.announced")
        await self._set_status(result.job, result.dataset, status, reason)
        await checkpoint("commit.saved")

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
            await checkpoint("abort.done")
            if result.status == "already_committed":
                await announce_from_manifest(self.ctx, work.dataset, work.job, lease.epoch)
                await checkpoint("abort.announced")
                await self._set_status(work.job, work.dataset, "committed")
                return
            # Redone after a crash, the files are gone already (files_deleted
            # counts what this call deleted); the event is announced once.
            await announce_aborted(self.ctx, work.dataset, work.job, work.reason, result.files_deleted)
            await checkpoint("abort.announced")
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

    async def _set_status(self, job: str, dataset: str, status: Status, reason: str = "") -> None:
        """Record a dataset's new status durably; end the job when all its datasets are done.

        The status, the result and the job's end are applied and saved under
        the save lock, and put back should the save fail (see ``_save_change``).

        Raises:
            Fenced, TransientError: the save failed; nothing changed in memory.
        """
        ending: list[Ended] = []  # the job's end, when this change ends it

        def change() -> Batch | None:
            meta = self.state.set_status(job, dataset, status, reason)
            if meta is None:
                return None
            self.state.jobs[job] = meta
            batch = Batch(jobs={job})
            result = self._result(job, dataset, status, reason)
            if result is not None:
                batch.results[(job, dataset)] = result
            done = self.state.job_done(job)
            if done is not None:
                batch.drop_attempts.extend(attempt_fields(self.state, job))
                # Only the end record before the save (the save writes it); the
                # job's records go once it is durable (see _save_change).
                ending.append(Ended(status=done, at=time.time()))
                self.state.ended[job] = ending[0]
                batch.jobs.discard(job)
                batch.ended.add(job)
            return batch

        def saved() -> None:
            if ending:
                self.state.end_job(job, ending[0].status, ending[0].at)

        await self._save_change(job, change, saved)

    def _result(self, job: str, dataset: str, status: Status, reason: str) -> DatasetResult | None:
        """Return the outcome record the job's driver reads, for a status it waits for (else None)."""
        if status == "committed":
            winners = self.state.winners(job, dataset) or []
            return DatasetResult(
                status="committed",
                files=sum(len(a.files) for a in winners),
                bytes=sum(f.size for a in winners for f in a.files),
                manifest=manifest_key(dataset, job),
                at=time.time(),
            )
        if status in ("aborted", "quarantined", "blocked"):
            return DatasetResult(status=status, reason=reason, at=time.time())
        return None


__all__ = ["ActionsMixin", "Recover", "Work", "work_key"]
