"""Operator actions on a quarantined sequence: ``retry`` (roll forward) and ``skip`` (roll back).

Both run under the dataset's lock (the caller passes its lease), first claim
the log with the operator's epoch (so any stale holder is fenced out), and
are safe to run again after a crash half way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from .._errors import BadInput, LinkRefused, NotFound
from ..events import commits_prefix, wal_key
from ..locks import Lease
from ..settings import Settings
from ..storage import ObjectStore
from ._bounded import with_retry
from ._commit import Pipeline
from ._model import Manifest
from ._publish import PublishFile
from ._registry import StepRegistry
from ._results import CommitResult, SkipResult
from ._steps import Cleanup, StepContext, WriteManifest, decode_manifest, delete_prefixes
from ._wal import Wal
from ._watermarks import AdvanceWatermarks, merge_watermarks, read_watermarks


async def _open(pipe: Pipeline, dataset: str, job: str) -> Wal:
    """Return the log of (dataset, job), not yet claimed. Raises NotFound (none), Fenced (a higher epoch)."""
    wal = await pipe.log.read(dataset, job)
    if wal is None:
        key = wal_key(dataset, job)
        raise NotFound(f"no unfinished sequence for dataset {dataset!r} job {job!r} ({key})")
    pipe.log.refuse_newer(wal)
    return wal


async def retry_quarantined(
    store: ObjectStore,
    dataset: str,
    job: str,
    lease: Lease,
    settings: Settings | None = None,
    *,
    registry: StepRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> CommitResult:
    """Clear the quarantine mark and attempts of (dataset, job), then recover the sequence.

    Use it once the cause is fixed (a permission, a throttled bucket, a staged
    file put back). A sequence that is not quarantined is simply recovered.

    Returns:
        ``committed``, or ``quarantined`` again (with the new reason).

    Raises:
        NotFound: there is no log for (dataset, job).
        Fenced: the log shows a higher epoch than ours.
        CommitStepFailed: the log is unreadable (fix or remove it by hand).
        LockLost, TransientError: as :func:`~shared.commit.execute_sequence`.
    """
    pipe = Pipeline(store, lease, settings or Settings(), registry=registry, clock=clock)
    wal = await _open(pipe, dataset, job)
    wal = await pipe.log.write(wal, quarantined=None, attempts=1)  # the claim
    return await pipe.run(wal, recovered=True)


async def _manifests(store: ObjectStore, dataset: str) -> list[Manifest]:
    out = []
    async for info in store.list(commits_prefix(dataset)):
        if info.key.endswith(".json"):
            obj = await store.read(info.key)
            out.append(decode_manifest(obj.data, info.key))
    return out


async def _delete_counted(ctx: StepContext, key: str) -> int:
    try:
        await ctx.store.head(key)
    except NotFound:
        return 0
    except LinkRefused:
        return 0  # a link planted in a local store: not an object, never deleted through
    ctx.lease.check()
    await ctx.store.delete(key)
    return 1


async def skip_quarantined(
    store: ObjectStore,
    dataset: str,
    job: str,
    lease: Lease,
    settings: Settings | None = None,
    *,
    registry: StepRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> SkipResult:
    """Abandon the quarantined sequence of (dataset, job) and unblock the dataset.

    A half-done commit cannot be rolled forward without its failed step, so
    skip rolls it back, keeping the store consistent for ``audit``:

    - If the job's manifest exists (equal to the planned one), the commit is
      complete and cannot be undone: only the log is deleted (``forgotten``);
      staged leftovers, if any, show up in ``audit``.
    - Else (``rolled_back``): every published file of the sequence that no
      manifest of the dataset lists is deleted, custom steps with an ``undo``
      coroutine are undone (last first), the staged files (winners and
      losers: the job's staging folder for the dataset) are deleted, and the
      log is deleted last. The job's data is then gone for good: re-run the
      job to produce it again.

    Refused when the sequence's watermarks are already in place and ahead of
    every manifest of the dataset: watermarks never move back, so rolling the
    data back would silently drop the records they cover. Use ``retry``.

    Returns:
        A :class:`SkipResult`.

    Raises:
        NotFound: there is no log for (dataset, job).
        BadInput: the sequence is not quarantined, or skip is refused (above).
        Fenced: the log shows a higher epoch than ours.
        CommitStepFailed: the log or a manifest is unreadable.
        LockLost, TransientError: the lease was lost, or the store kept failing
            (run skip again: it is idempotent).
    """
    pipe = Pipeline(store, lease, settings or Settings(), registry=registry, clock=clock)
    wal = await _open(pipe, dataset, job)
    seq = wal.sequence
    if seq.quarantined is None:
        raise BadInput(f"{wal.key} is not quarantined; skip only abandons quarantined sequences")
    wal = await pipe.log.write(wal)  # claim: from now on a stale holder's log write fails
    policy, ctx = pipe.policy, pipe.ctx

    manifests = await with_retry(lambda: _manifests(store, dataset), policy)
    planned = next((s for s in seq.steps if isinstance(s, WriteManifest)), None)
    own = [m for m in manifests if m.job == job]
    if own and planned is not None and own[0].same_commit(planned.manifest(0.0)):
        await pipe.log.delete(wal)
        return SkipResult(dataset=dataset, job=job, outcome="forgotten")

    others = [m for m in manifests if m.job != job]
    committed_marks: dict[str, int] = {}
    for m in others:
        committed_marks = merge_watermarks(committed_marks, m.watermarks)
    current = await with_retry(lambda: read_watermarks(store, dataset), policy)
    for step in seq.steps:
        if isinstance(step, AdvanceWatermarks):
            # In place and ahead of every manifest: only this sequence can
            # have put them there (older ones are finished, newer ones blocked).
            ahead = sorted(
                k
                for k, v in step.values.items()
                if k in current
                and current[k] >= v
                and (k not in committed_marks or current[k] > committed_marks[k])
            )
            if ahead:
                raise BadInput(
                    f"cannot skip {wal.key}: its watermarks {ahead} are already advanced past every "
                    "manifest; rolling back would drop the data they cover. Fix the cause and use retry."
                )

    listed = {f.key for m in manifests for f in m.files}
    published = 0
    for step in seq.steps:
        if isinstance(step, PublishFile) and step.dst not in listed:
            published += await with_retry(partial(_delete_counted, ctx, step.dst), policy)
    for step in reversed(seq.steps):
        undo = getattr(step, "undo", None)
        if undo is not None:
            await with_retry(partial(undo, ctx), policy)
    staged = 0
    for step in seq.steps:
        if isinstance(step, PublishFile):
            staged += await with_retry(partial(_delete_counted, ctx, step.src), policy)
    prefixes = [p for s in seq.steps if isinstance(s, Cleanup) for p in s.prefixes]
    staged += await with_retry(partial(delete_prefixes, ctx, prefixes), policy)
    await pipe.log.delete(wal)
    return SkipResult(
        dataset=dataset, job=job, outcome="rolled_back", published_deleted=published, staged_deleted=staged
    )


__all__ = ["retry_quarantined", "skip_quarantined"]
