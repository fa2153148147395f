"""The commit pipeline: one dataset's commit of one job, from the survey to the finish.

:func:`commit_dataset`, top to bottom, with the module that holds each stage:

1. **Survey** (:mod:`._survey`): one round lists the dataset's logs and the
   job's staging folder for the dataset together. Nothing is written.
2. **Older sequences first** (:meth:`Pipeline.recover`, stages 3-5 for each):
   every other unfinished sequence of the dataset, oldest first. A
   quarantined or unreadable one blocks the dataset (``blocked``). Skipped
   when the survey found no log (the usual case).
   **2b. The stream gate** (:mod:`._stream_gate`): a streaming job's
   micro-batch that the dataset's record already covers is ``refused`` (its
   staged files deleted); one read, only for streaming jobs.
3. **Claim or create the log** (:class:`~._wal.WalLog`): this job's log,
   found in the survey, is re-read and claimed with our epoch (its steps win:
   ``recovered``); else the manifest is read when it may exist (the job is
   then ``already_committed``); else the request is planned
   (:func:`~._plan.plan_commit`) and the log created (create-if-absent). From
   here on the log is a :class:`~._wal.Wal` value handed from stage to stage.
4. **Run the steps** (:mod:`._execute`): publishes (verified, copied in
   parallel, the sources deleted with the fence), watermarks, the table and
   custom steps, the manifest, the clean-up; each under the retry budget.
5. **Finish** (:meth:`Pipeline.run`): delete the log (``committed``), or mark
   it quarantined with the first failure's reason (``quarantined``).

The critical path of a commit alone: lock (the caller's), survey, log create,
copies, source deletes with the fence, watermark CAS, manifest, clean-up, log
delete. :func:`recover_dataset` runs stages 3-5 for each unfinished log of a
dataset, :func:`execute_sequence` for a sequence given as it is; the
operator's ``retry`` (:mod:`._operator`) runs stages 4-5.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

import msgspec

from ..events import staging_prefix
from ..locks import Lease
from ..settings import Settings
from ..storage import ObjectInfo, ObjectStore
from ..tracing import NO_TRACER, Tracer
from ._bounded import commit_policy, with_retry
from ._errors import CommitStepFailed
from ._execute import run_steps
from ._model import CommitRequest, Manifest
from ._plan import plan_commit
from ._registry import StepRegistry
from ._results import CommitResult, CommitStatus, RecoveryResult
from ._steps import CommitProbe, CommitStep, StepContext, delete_prefixes, no_probe, read_manifest
from ._stream_gate import check_stream
from ._survey import Survey, list_unfinished, survey
from ._wal import CommitSequence, Wal, WalLog


async def commit_dataset(
    store: ObjectStore,
    req: CommitRequest,
    lease: Lease,
    settings: Settings,
    *,
    registry: StepRegistry | None = None,
    extra_steps: Sequence[CommitStep] = (),
    clock: Callable[[], float] = time.time,
    probe: CommitProbe = no_probe,
    tracer: Tracer = NO_TRACER,
) -> CommitResult:
    """Commit ``req`` exactly once, under the dataset's lock (``lease``): the pipeline of the module doc.

    The lock is not taken here: the caller holds it and passes its lease.
    ``probe`` is called at the points a test may hook into (see :data:`CommitProbe`).
    ``tracer`` records a span per phase of the steps, under the caller's current span.

    Returns:
        ``committed``, ``quarantined``, ``blocked`` or ``refused`` (see :class:`CommitResult`).

    Raises:
        BadInput: the request is inconsistent (see :func:`plan_commit`).
        LockLost / Fenced: the lease was lost, or a newer holder took over.
        TransientError: the store failed past the budget on the log itself.

    Cancelled: whatever ran is idempotent; the next holder verifies it.
    """
    start = time.monotonic()
    lease.check()
    pipe = Pipeline(store, lease, settings, registry=registry, clock=clock, probe=probe, tracer=tracer)
    earlier: list[CommitResult] = []
    recovered_jobs: list[str] = []

    def finish(res: CommitResult) -> CommitResult:
        return msgspec.structs.replace(
            res, recovered_jobs=recovered_jobs, earlier=earlier, duration=time.monotonic() - start
        )

    def blocked(by: str, reason: str | None) -> CommitResult:
        res = CommitResult(
            dataset=req.dataset, job=req.job, status="blocked", blocked_by=by, quarantined=reason
        )
        return finish(res)

    # 1. Survey.
    found = await survey(store, req.dataset, req.job, pipe.policy, registry)

    # 2. Older sequences first (none when the survey found no log: the usual case).
    if found.unfinished:
        recovery = await pipe.recover(req.dataset, exclude_job=req.job)
        earlier.extend(recovery.results)
        recovered_jobs.extend(r.job for r in recovery.results if r.ok)
        if recovery.blocked_by is not None:
            return blocked(recovery.blocked_by, recovery.reason)

    try:
        # 2b. A streaming job's batch that the dataset already holds is refused (no log of its own yet).
        if req.stream is not None and not any(u.job == req.job for u in found.unfinished):
            refused = await pipe.stream_gate(req)
            if refused is not None:
                return finish(refused)
        # 3. Claim or create the log (or find the job committed).
        held = await pipe.claim_or_create(req, found, extra_steps)
        if isinstance(held, Manifest):
            return finish(_found_committed(req, held))
        wal, created = held
        # 4 and 5. Run the steps, finish. A log created after the survey
        # found none is judged on the survey's listing of the sources.
        listed = found.staged if created and not found.unfinished else None
        return finish(await pipe.run(wal, recovered=not created, listed=listed))
    except CommitStepFailed as exc:
        # A log (ours, or one that appeared meanwhile) or the manifest cannot be read: it blocks the dataset.
        return blocked(req.job, str(exc))


class Pipeline:
    """Stages 2 to 5 of the module doc, for one lock holder: built per call with what every stage needs.

    Owns the holder's :class:`WalLog` (the store, the lease, the retry policy,
    the step registry, the clock) and the :class:`StepContext` the steps run
    with (the settings, the probe). Keeps no state between calls.
    """

    def __init__(
        self,
        store: ObjectStore,
        lease: Lease,
        settings: Settings,
        *,
        registry: StepRegistry | None = None,
        clock: Callable[[], float] = time.time,
        probe: CommitProbe = no_probe,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self.store = store
        self.lease = lease
        self.registry = registry
        self.policy = commit_policy(settings)
        self.log = WalLog(store, lease, policy=self.policy, registry=registry, clock=clock)
        self.ctx = StepContext(
            store=store, lease=lease, settings=settings, clock=clock, probe=probe, tracer=tracer
        )

    async def recover(self, dataset: str, *, exclude_job: str | None = None) -> RecoveryResult:
        """Stage 2: finish the dataset's unfinished sequences, oldest first (all but ``exclude_job``'s).

        Stops at the first sequence that is quarantined, unreadable, or gets
        quarantined now: the result's ``blocked_by`` names its job.

        Returns:
            A :class:`RecoveryResult` with one :class:`CommitResult` per sequence run.

        Raises:
            LockLost / Fenced: the lease was lost or a newer holder took over.
            TransientError: the store failed past the budget on a log itself.

        Cancelled: the sequence being run is left for the next holder.
        """
        results: list[CommitResult] = []
        for u in await list_unfinished(self.store, dataset, registry=self.registry):
            if u.job == exclude_job:
                continue
            if u.quarantined is not None:
                reason = u.quarantined
                return RecoveryResult(dataset=dataset, results=results, blocked_by=u.job, reason=reason)
            try:
                wal = await self.log.read(dataset, u.job)
                if wal is not None:
                    wal = await self.log.claim(wal)
            except CommitStepFailed as exc:
                return RecoveryResult(dataset=dataset, results=results, blocked_by=u.job, reason=str(exc))
            if wal is None:
                continue  # finished by someone else since we listed it
            res = await self.run(wal, recovered=True)
            results.append(res)
            if not res.ok:
                return RecoveryResult(
                    dataset=dataset, results=results, blocked_by=u.job, reason=res.quarantined
                )
        return RecoveryResult(dataset=dataset, results=results)

    async def stream_gate(self, req: CommitRequest) -> CommitResult | None:
        """Stage 2b: refuse a streaming job's batch the dataset's record covers; None to go on.

        A refusal deletes the job's staged files for the dataset (as an abort does).

        Raises:
            CommitStepFailed: the watermarks document is unreadable.
            LockLost / TransientError: as the abort's clean-up.
        """
        assert req.stream is not None
        reason = await with_retry(
            partial(check_stream, self.store, req.dataset, req.stream, req.job), self.policy
        )
        if reason is None:
            return None
        self.lease.check()
        deleted = await with_retry(
            partial(delete_prefixes, self.ctx, [staging_prefix(req.job, req.dataset)]), self.policy
        )
        return CommitResult(
            dataset=req.dataset, job=req.job, status="refused", refused=reason, files_deleted=deleted
        )

    async def claim_or_create(
        self, req: CommitRequest, found: Survey, extra_steps: Sequence[CommitStep]
    ) -> tuple[Wal, bool] | Manifest:
        """Stage 3: return ``(wal, created)`` for the log this holder now holds, or the manifest found.

        With no log in the survey (the usual case) the request is planned
        first and the log created without reading it; the manifest is read
        only when the listing misses a winner's file. Otherwise this job's log
        is read and claimed when it is there (the request is not planned: the
        log's steps win); else the manifest is read; else the request is
        planned and the log opened (read, then created or claimed).

        Raises:
            BadInput: the request is inconsistent (see :func:`plan_commit`).
            CommitStepFailed: the log or the manifest is unreadable.
            LockLost / Fenced / TransientError: as :class:`WalLog`.
        """
        epoch, now = self.lease.epoch, self.ctx.clock
        if not found.unfinished:
            seq = plan_commit(req, epoch, now=now(), extra_steps=extra_steps)
            if found.may_be_committed(seq):
                manifest = await read_manifest(self.store, req.dataset, req.job)
                if manifest is not None:
                    return manifest
            return await self.log.create(seq)
        wal = await self.log.read(req.dataset, req.job)
        if wal is not None:
            return await self.log.claim(wal), False
        manifest = await read_manifest(self.store, req.dataset, req.job)
        if manifest is not None:
            return manifest
        return await self.log.open(plan_commit(req, epoch, now=now(), extra_steps=extra_steps))

    async def run(
        self, wal: Wal, *, recovered: bool, listed: dict[str, ObjectInfo] | None = None
    ) -> CommitResult:
        """Stages 4 and 5: run the steps of a log this holder created or claimed, then finish.

        ``listed``: the job's staging folder for the dataset as this holder
        listed it before creating the log (sources are judged on it); None to
        list it before the publish phase.

        Returns:
            ``committed`` (log deleted), ``quarantined`` (quarantined now: the
            log keeps the reason) or ``blocked`` (it was quarantined before
            this call: nothing ran; ``blocked_by`` is its own job).

        Raises:
            LockLost / Fenced: the lease was lost or a newer holder took over;
                the log is left as it is for that holder.
            TransientError: the store failed past the budget while writing the
                log itself (the sequence is then neither finished nor quarantined).

        Cancelled: steps in flight are cancelled; everything done so far is
        idempotent and the next holder verifies it.
        """
        start = time.monotonic()
        seq = wal.sequence

        def result(
            status: CommitStatus,
            redone: int = 0,
            reason: str | None = None,
            timings: dict[str, float] | None = None,
        ) -> CommitResult:
            return _result(seq, status, start, redone, reason, recovered=recovered, timings=timings or {})

        if seq.quarantined is not None:
            # Quarantined earlier (and reported then): nothing runs until an operator acts.
            return result("blocked", reason=seq.quarantined)
        held = wal

        async def fence(done: list[int]) -> None:
            nonlocal held
            held = await self.log.write(held, done=done)

        progress = await run_steps(
            seq.steps, self.ctx, self.policy, dataset=seq.dataset, job=seq.job, listed=listed, fence=fence
        )
        if progress.failure is not None:
            await self.log.write(held, quarantined=progress.failure, done=sorted(progress.done))
            return result("quarantined", progress.redone, progress.failure, progress.timings)
        await self.log.delete(held)
        return result("committed", progress.redone, timings=progress.timings)


async def recover_dataset(
    store: ObjectStore,
    dataset: str,
    lease: Lease,
    settings: Settings,
    *,
    registry: StepRegistry | None = None,
    exclude_job: str | None = None,
    clock: Callable[[], float] = time.time,
    probe: CommitProbe = no_probe,
    tracer: Tracer = NO_TRACER,
) -> RecoveryResult:
    """Finish the dataset's unfinished sequences, oldest first (all but ``exclude_job``'s): stages 3-5 each.

    Returns, raises and cancellation: as :meth:`Pipeline.recover`.
    """
    pipe = Pipeline(store, lease, settings, registry=registry, clock=clock, probe=probe, tracer=tracer)
    return await pipe.recover(dataset, exclude_job=exclude_job)


async def execute_sequence(
    store: ObjectStore,
    seq: CommitSequence,
    lease: Lease,
    settings: Settings,
    *,
    registry: StepRegistry | None = None,
    clock: Callable[[], float] = time.time,
    probe: CommitProbe = no_probe,
) -> CommitResult:
    """Write ``seq``'s log (or claim the one already there, whose steps win) and run it: stages 3-5.

    Returns:
        ``committed``, ``quarantined`` or ``blocked`` (see :class:`CommitResult`).

    Raises:
        Fenced: the log shows a higher epoch than ``lease.epoch``, or a newer
            holder rewrote it while we ran; we stopped.
        LockLost: the lease was lost; we stopped.
        CommitStepFailed: an existing log is unreadable or names another job.
        TransientError: the store failed past the budget on the log itself.

    Cancelled: as :meth:`Pipeline.run`.
    """
    pipe = Pipeline(store, lease, settings, registry=registry, clock=clock, probe=probe)
    wal, created = await pipe.log.open(seq)
    return await pipe.run(wal, recovered=not created)


def _result(
    seq: CommitSequence,
    status: CommitStatus,
    start: float,
    redone: int,
    reason: str | None,
    *,
    recovered: bool,
    timings: dict[str, float],
) -> CommitResult:
    return CommitResult(
        dataset=seq.dataset,
        job=seq.job,
        status=status,
        blocked_by=seq.job if status == "blocked" else None,
        files=seq.files,
        bytes=seq.bytes,
        duration=time.monotonic() - start,
        steps=len(seq.steps),
        steps_redone=redone,
        recovered=recovered,
        attempts=seq.attempts,
        quarantined=reason,
        phase_seconds=timings,
    )


def _found_committed(req: CommitRequest, manifest: Manifest) -> CommitResult:
    """Return the result of a commit whose manifest was already in the store."""
    return CommitResult(
        dataset=req.dataset,
        job=req.job,
        status="committed",
        files=len(manifest.files),
        bytes=manifest.bytes,
        already_committed=True,
    )


__all__ = ["Pipeline", "commit_dataset", "execute_sequence", "recover_dataset"]
