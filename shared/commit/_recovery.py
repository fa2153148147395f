"""Recovery: find unfinished sequences and finish them, verifying every step.

The progress a log records is a hint only: recovery calls ``is_done`` on every
step and redoes what is not done, in the usual phase order.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from ..events import wal_prefix
from ..locks import Lease
from ..settings import Settings
from ..storage import ObjectStore
from ._errors import CommitStepFailed
from ._execute import commit_policy, run_claimed
from ._registry import StepRegistry
from ._results import CommitResult, RecoveryResult
from ._wal import CommitSequence, claim_sequence, read_sequence_at


class UnfinishedSequence(msgspec.Struct, frozen=True, kw_only=True):
    """One log found under ``_wal/``: its sequence, or why it cannot be read."""

    dataset: str
    job: str
    key: str
    sequence: CommitSequence | None = None
    error: str | None = None

    @property
    def quarantined(self) -> str | None:
        """Why the sequence is set aside (quarantined or unreadable), else None."""
        if self.error is not None:
            return self.error
        return None if self.sequence is None else self.sequence.quarantined


def _split_wal_key(key: str) -> tuple[str, str] | None:
    parts = key.split("/")
    if len(parts) != 3 or not parts[2].endswith(".json") or len(parts[2]) <= len(".json"):
        return None
    return parts[1], parts[2][: -len(".json")]


async def list_unfinished(
    store: ObjectStore, dataset: str | None = None, *, registry: StepRegistry | None = None
) -> list[UnfinishedSequence]:
    """Return every log under ``_wal/`` (or ``_wal/<dataset>/``), oldest first.

    Unreadable logs are returned with ``error`` set (and sort first: they
    block their dataset). Objects under ``_wal/`` that are not logs are ignored.

    Raises:
        TransientError: from the store.
    """
    found: list[UnfinishedSequence] = []
    async for info in store.list(wal_prefix(dataset)):
        parsed = _split_wal_key(info.key)
        if parsed is None:
            continue
        ds, job = parsed
        try:
            got = await read_sequence_at(store, info.key, registry)
        except CommitStepFailed as exc:
            found.append(UnfinishedSequence(dataset=ds, job=job, key=info.key, error=str(exc)))
            continue
        if got is not None:  # finished between the listing and the read
            found.append(UnfinishedSequence(dataset=ds, job=job, key=info.key, sequence=got[0]))
    found.sort(key=lambda u: (u.sequence.created_at if u.sequence else 0.0, u.dataset, u.job))
    return found


async def recover_dataset(
    store: ObjectStore,
    dataset: str,
    lease: Lease,
    settings: Settings,
    *,
    registry: StepRegistry | None = None,
    exclude_job: str | None = None,
    clock: Callable[[], float] = time.time,
) -> RecoveryResult:
    """Finish the dataset's unfinished sequences, oldest first (all but ``exclude_job``'s).

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
    policy = commit_policy(settings)
    for u in await list_unfinished(store, dataset, registry=registry):
        if u.job == exclude_job:
            continue
        if u.quarantined is not None:
            return RecoveryResult(dataset=dataset, results=results, blocked_by=u.job, reason=u.quarantined)
        try:
            handle = await claim_sequence(
                store, dataset, u.job, lease, policy=policy, registry=registry, clock=clock
            )
        except CommitStepFailed as exc:
            return RecoveryResult(dataset=dataset, results=results, blocked_by=u.job, reason=str(exc))
        if handle is None:
            continue  # finished by someone else since we listed it
        res = await run_claimed(handle, store, lease, settings, recovered=True, clock=clock)
        results.append(res)
        if not res.ok:
            return RecoveryResult(dataset=dataset, results=results, blocked_by=u.job, reason=res.quarantined)
    return RecoveryResult(dataset=dataset, results=results)


__all__ = ["UnfinishedSequence", "list_unfinished", "recover_dataset"]
