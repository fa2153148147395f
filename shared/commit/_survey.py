"""The survey: what the store already holds for a dataset, read before anything is written.

- :func:`list_unfinished`: the logs under ``_wal/`` (or one dataset's), each
  read, oldest first: the sequences to finish before a new one runs.
- :func:`list_staging`: the job's staging folder for the dataset: the
  sources are judged on this listing, and while any winner's source is listed
  the job cannot have been committed (its manifest is not read).
- :func:`survey`: both, in one round, for a new commit.

Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import msgspec

from .._retry import RetryPolicy
from ..events import staging_prefix, wal_prefix
from ..storage import ObjectInfo, ObjectStore
from ._bounded import for_each_bounded, with_retry
from ._errors import CommitStepFailed
from ._publish import PublishFile
from ._registry import StepRegistry
from ._wal import CommitSequence, read_wal


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
    store: ObjectStore,
    dataset: str | None = None,
    *,
    registry: StepRegistry | None = None,
    datasets: Callable[[str], bool] | None = None,
) -> list[UnfinishedSequence]:
    """Return every log under ``_wal/`` (or ``_wal/<dataset>/``), oldest first.

    ``datasets``: read only the logs of the datasets it returns True for (a
    shard's owner reads its own shard's, not every shard's: one read each).

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
        if datasets is not None and not datasets(ds):
            continue
        try:
            got = await read_wal(store, info.key, registry)
        except CommitStepFailed as exc:
            found.append(UnfinishedSequence(dataset=ds, job=job, key=info.key, error=str(exc)))
            continue
        if got is not None:  # finished between the listing and the read
            found.append(UnfinishedSequence(dataset=ds, job=job, key=info.key, sequence=got.sequence))
    found.sort(key=lambda u: (u.sequence.created_at if u.sequence else 0.0, u.dataset, u.job))
    return found


async def list_staging(
    store: ObjectStore, job: str, dataset: str, policy: RetryPolicy
) -> dict[str, ObjectInfo]:
    """Return the job's staging folder for the dataset as listed now, by key (retried under ``policy``)."""

    async def listing() -> dict[str, ObjectInfo]:
        return {i.key: i async for i in store.list(staging_prefix(job, dataset))}

    return await with_retry(listing, policy)


@dataclass(frozen=True, slots=True)
class Survey:
    """What a new commit found before writing: the dataset's logs and the job's staged files."""

    unfinished: list[UnfinishedSequence] = field(default_factory=list)
    staged: dict[str, ObjectInfo] = field(default_factory=dict)

    def may_be_committed(self, seq: CommitSequence) -> bool:
        """Return True when the job's manifest may exist, so it must be read.

        A manifest can exist only once every winner's staged file is gone (the
        sources are deleted before the manifest is written, and never come
        back): while the listing shows every source, it does not.
        """
        publishes = [s for s in seq.steps if isinstance(s, PublishFile)]
        return not publishes or any(s.src not in self.staged for s in publishes)


async def survey(
    store: ObjectStore, dataset: str, job: str, policy: RetryPolicy, registry: StepRegistry | None
) -> Survey:
    """List the dataset's logs and the job's staging folder for the dataset together, in one round.

    Raises:
        TransientError: the store kept failing past ``policy``'s budget.

    Cancelled: both listings are cancelled; nothing was written.
    """
    unfinished: list[UnfinishedSequence] = []
    staged: dict[str, ObjectInfo] = {}

    async def logs() -> None:
        unfinished[:] = await with_retry(partial(list_unfinished, store, dataset, registry=registry), policy)

    async def staging() -> None:
        staged.update(await list_staging(store, job, dataset, policy))

    async def call(fn: Callable[[], Awaitable[None]]) -> None:
        await fn()

    await for_each_bounded([logs, staging], call, 2)
    return Survey(unfinished=unfinished, staged=staged)


__all__ = ["Survey", "UnfinishedSequence", "list_staging", "list_unfinished", "survey"]
