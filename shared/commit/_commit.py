"""The one call the worker makes to commit a dataset of a finished job."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec

from .._settings import Settings
from ..locks import Lease
from ..storage import ObjectStore
from ._errors import CommitStepFailed
from ._execute import commit_policy, execute_sequence, run_claimed
from ._model import CommitRequest
from ._plan import plan_commit
from ._recovery import recover_dataset
from ._registry import StepRegistry
from ._results import CommitResult
from ._steps import CommitStep, read_manifest
from ._wal import claim_sequence


async def commit_dataset(
    store: ObjectStore,
    req: CommitRequest,
    lease: Lease,
    settings: Settings,
    *,
    registry: StepRegistry | None = None,
    extra_steps: Sequence[CommitStep] = (),
    clock: Callable[[], float] = time.time,
) -> CommitResult:
    """Commit ``req`` exactly once, under the dataset's lock (``lease``).

    1. Finish every other unfinished sequence of the dataset, oldest first. A
       quarantined or unreadable one blocks the dataset: ``blocked``.
    2. If this job's log exists, recover it (``recovered``).
    3. Else, if this job's manifest exists, it is already committed: the
       result repeats the manifest's figures (``already_committed``).
    4. Else plan, write the log, execute.

    The lock is not taken here: the caller holds it and passes its lease.

    Returns:
        ``committed``, ``quarantined`` or ``blocked`` (see :class:`CommitResult`).

    Raises:
        BadInput: the request is inconsistent (see :func:`plan_commit`).
        LockLost / Fenced: the lease was lost, or a newer holder took over.
        TransientError: the store failed past the budget on the log itself.

    Cancelled: whatever ran is idempotent; the next holder verifies it.
    """
    start = time.monotonic()
    lease.check()

    earlier: list[CommitResult] = []

    def finish(res: CommitResult, recovered_jobs: list[str]) -> CommitResult:
        return msgspec.structs.replace(
            res, recovered_jobs=recovered_jobs, earlier=earlier, duration=time.monotonic() - start
        )

    def blocked(by: str, reason: str | None, recovered_jobs: list[str]) -> CommitResult:
        res = CommitResult(
            dataset=req.dataset, job=req.job, status="blocked", blocked_by=by, quarantined=reason
        )
        return finish(res, recovered_jobs)

    recovery = await recover_dataset(
        store, req.dataset, lease, settings, registry=registry, exclude_job=req.job, clock=clock
    )
    earlier.extend(recovery.results)
    recovered_jobs = [r.job for r in recovery.results if r.ok]
    if recovery.blocked_by is not None:
        return blocked(recovery.blocked_by, recovery.reason, recovered_jobs)

    try:
        handle = await claim_sequence(
            store, req.dataset, req.job, lease, policy=commit_policy(settings), registry=registry, clock=clock
        )
        if handle is not None:
            res = await run_claimed(handle, store, lease, settings, recovered=True, clock=clock)
            return finish(res, recovered_jobs)
        manifest = await read_manifest(store, req.dataset, req.job)
    except CommitStepFailed as exc:
        return blocked(req.job, str(exc), recovered_jobs)
    if manifest is not None:
        res = CommitResult(
            dataset=req.dataset,
            job=req.job,
            status="committed",
            files=len(manifest.files),
            bytes=manifest.bytes,
            already_committed=True,
        )
        return finish(res, recovered_jobs)

    seq = plan_commit(req, lease.epoch, now=clock(), extra_steps=extra_steps)
    try:
        res = await execute_sequence(store, seq, lease, settings, registry=registry, clock=clock)
    except CommitStepFailed as exc:
        # A log appeared meanwhile that cannot be read: it blocks the dataset.
        return blocked(req.job, str(exc), recovered_jobs)
    return finish(res, recovered_jobs)


__all__ = ["commit_dataset"]
