"""The audit's table part: every manifest of a bound dataset has exactly one snapshot, and no snapshot
carries a job without a manifest (unless that job's sequence is still open)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ..events import manifest_key
from ..settings import Settings
from ._catalog import in_thread
from ._catalog_ops import DATASET_PROPERTY, JOB_PROPERTY, load_table, open_catalog


def _table_jobs(settings: Settings, store_url: str, table: str) -> Counter[tuple[str, str]] | None:
    """Return how many snapshots of ``table`` carry each (dataset, job); None when there is no table."""
    tbl = load_table(open_catalog(settings, store_url), table)
    if tbl is None:
        return None
    found: Counter[tuple[str, str]] = Counter()
    for snap in tbl.metadata.snapshots:
        s = snap.summary
        if s is not None and s.get(JOB_PROPERTY) is not None:
            found[(s.get(DATASET_PROPERTY, ""), s.get(JOB_PROPERTY, ""))] += 1
    return found


async def table_violations(
    settings: Settings,
    store_url: str,
    tables: Mapping[str, str],
    committed: set[tuple[str, str]],
    open_jobs: set[tuple[str, str]],
) -> list[tuple[str, str, str]]:
    """Return ``(kind, key, detail)`` for each breach of the table rules over the bound datasets ``tables``.

    Kinds: ``missing_snapshot`` (a manifest, no snapshot), ``duplicate_snapshot``
    (a job landed twice), ``snapshot_without_manifest`` (a snapshot of a job
    with neither manifest nor open sequence).

    Raises:
        CommitStepFailed / TransientError / OutcomeUnknown: the catalog cannot be read.
    """
    out: list[tuple[str, str, str]] = []
    for dataset, table in sorted(tables.items()):

        def read(table: str = table) -> Counter[tuple[str, str]] | None:
            return _table_jobs(settings, store_url, table)

        found = await in_thread(read, settings.tables.call_timeout) or Counter()
        for ds, job in sorted(c for c in committed if c[0] == dataset):
            n = found.get((ds, job), 0)
            if n == 0:
                out.append(("missing_snapshot", manifest_key(ds, job), f"no snapshot of {table} carries it"))
            elif n > 1:
                out.append(
                    ("duplicate_snapshot", manifest_key(ds, job), f"{n} snapshots of {table} carry it")
                )
        for ds, job in sorted(found):
            if ds == dataset and (ds, job) not in committed and (ds, job) not in open_jobs:
                out.append(
                    (
                        "snapshot_without_manifest",
                        manifest_key(ds, job),
                        f"a snapshot of {table} carries job {job}, which has no manifest",
                    )
                )
    return out


__all__ = ["table_violations"]
