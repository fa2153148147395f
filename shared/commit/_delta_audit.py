"""The audit's Delta part: the log of a Delta-bound dataset against its manifests.

Every manifest has exactly one fleet version carrying its job, whose ``add``
actions are exactly the manifest's Parquet files; no fleet version carries a
job without a manifest (unless that job's sequence is still open); every file
of the current snapshot exists. A manifest's file that an ``overwrite``
removed from the snapshot may be gone (``vacuum``): that is not a
``missing_file``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .._errors import NotFound
from ..events import manifest_key
from ..storage import ObjectStore
from ._bounded import for_each_bounded
from ._delta import log_prefix, read_state
from ._delta_log import DeltaState, commit_name, decode_path, read_listing
from ._errors import CommitStepFailed

_READS = 8


@dataclass
class DeltaAudit:
    """What the Delta part found: ``(kind, key, detail)`` breaches, and the keys that may be missing."""

    violations: list[tuple[str, str, str]] = field(default_factory=list)
    may_be_missing: set[str] = field(default_factory=set)


async def _fleet_versions(
    store: ObjectStore, dataset: str
) -> tuple[dict[str, list[tuple[int, set[str]]]], bool]:
    """Return job -> [(version, added keys)] of the fleet commits in the JSON log, and if it starts at 0."""
    prefix = log_prefix(dataset)
    listing = read_listing([info.key[len(prefix) :] async for info in store.list(prefix)])
    found: dict[str, list[tuple[int, set[str]]]] = defaultdict(list)

    async def one(version: int) -> None:
        key = prefix + commit_name(version)
        try:
            body = (await store.read(key)).data
        except NotFound:
            return  # cleaned up since the listing
        state = DeltaState()
        state.apply(version, body, key)
        owner = state.fleet_commits.get(version)
        if owner is not None and owner[0] == dataset:
            added = {f"{dataset}/{decode_path(p)}" for p in state.files}
            found[owner[1]].append((version, added))

    await for_each_bounded(listing.commits, one, _READS)
    return found, bool(listing.commits) and listing.commits[0] == 0


async def delta_violations(
    store: ObjectStore,
    dataset: str,
    manifests: Mapping[str, Sequence[str]],
    open_jobs: set[str],
    existing: set[str],
) -> DeltaAudit:
    """Return the breaches of the Delta rules for ``dataset`` (see the module doc).

    ``manifests``: job -> the Parquet keys its manifest lists; ``open_jobs``:
    jobs with an open sequence of the dataset; ``existing``: the dataset's
    published keys the audit listed.

    Kinds: ``missing_snapshot``, ``duplicate_snapshot``,
    ``snapshot_without_manifest`` (as for Iceberg, a Delta version standing
    for a snapshot), ``table_files_differ`` (a job's version adds other files
    than its manifest lists), ``missing_file`` (a file of the current
    snapshot is gone), ``unreadable_table`` (the log cannot be replayed).

    Raises:
        TransientError / OutcomeUnknown: the store failed.
    """
    out = DeltaAudit()
    prefix = log_prefix(dataset)
    try:
        state = await read_state(store, dataset)
        versions, complete = await _fleet_versions(store, dataset)
    except CommitStepFailed as exc:
        out.violations.append(("unreadable_table", prefix, str(exc)))
        return out
    active = set() if state is None else {f"{dataset}/{decode_path(p)}" for p in state.files}
    for job, keys in sorted(manifests.items()):
        mkey = manifest_key(dataset, job)
        mine = versions.get(job, [])
        if not mine:
            if complete:
                out.violations.append(("missing_snapshot", mkey, f"no version of {prefix} carries it"))
        elif len(mine) > 1:
            vs = ", ".join(str(v) for v, _ in sorted(mine))
            out.violations.append(("duplicate_snapshot", mkey, f"versions {vs} of {prefix} carry it"))
        elif mine[0][1] != set(keys):
            out.violations.append(
                (
                    "table_files_differ",
                    mkey,
                    f"version {mine[0][0]} adds {len(mine[0][1])} files, "
                    f"the manifest lists {len(keys)} Parquet files",
                )
            )
        out.may_be_missing.update(k for k in keys if k not in active)
    for job in sorted(versions):
        if job not in manifests and job not in open_jobs:
            out.violations.append(
                (
                    "snapshot_without_manifest",
                    manifest_key(dataset, job),
                    f"version {versions[job][0][0]} of {prefix} carries job {job}, which has no manifest",
                )
            )
    listed = {k for keys in manifests.values() for k in keys}  # the audit reports those itself
    for key in sorted(active - existing - listed):
        out.violations.append(("missing_file", key, f"in the current snapshot of {prefix}"))
    return out


__all__ = ["DeltaAudit", "delta_violations"]
