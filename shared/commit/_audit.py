"""``audit``: an fsck for commits. Lists the store and reports every breach of the exactly-once rules.

It reads only; it never repairs. Kinds of violation (``AuditViolation.kind``):

- ``unlisted_file``: a published file that no manifest lists (and no
  unfinished sequence is publishing).
- ``missing_file``: a manifest lists a file that does not exist.
- ``wrong_size`` / ``wrong_checksum``: a listed file differs from its listing
  (the MD5 from the listing, else ``head_md5``: computed on local files; a
  file whose store keeps no MD5, such as an S3 multipart upload, is compared
  by size only).
- ``listed_twice``: two manifests list the same file.
- ``unreadable_manifest``, ``unreadable_watermarks``, ``unreadable_sequence``.
- ``staged_leftover``: a staged file of an ended job: the job has a manifest
  for that dataset (or is in ``ended_jobs``) and no sequence is running for it.
- ``unfinished_sequence`` / ``quarantined_sequence``: a log under ``_wal/``.
- ``watermark_behind``: a watermark below what a manifest committed (or missing).
- Bound datasets (``settings.tables.bindings``, ``tables``, and the table
  steps of open sequences): ``missing_snapshot`` (a manifest whose job no
  snapshot of the table carries), ``duplicate_snapshot`` (two snapshots carry
  it), ``snapshot_without_manifest`` (a snapshot of a job with neither
  manifest nor open sequence). A dataset bound after its first commits
  reports those earlier manifests as missing their snapshots.
- Delta tables (any dataset folder with a ``_delta_log/``, see
  :mod:`._delta_audit`): the same three kinds, a Delta version standing for
  a snapshot; ``table_files_differ``, ``unreadable_table``; a file an
  ``overwrite`` removed from the table may be gone (vacuumed).

Locks under ``_locks/`` are fine to leave and are not reported.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from .._errors import BadInput, NotFound
from ..events import commits_prefix, parse_staged_key, staging_prefix, wal_prefix, watermarks_key
from ..settings import Settings
from ..storage import ObjectInfo, ObjectStore
from ._bounded import for_each_bounded
from ._catalog import CommitToTable
from ._catalog_audit import table_violations
from ._delta_audit import delta_violations
from ._delta_log import DELTA_LOG
from ._errors import CommitStepFailed
from ._publish import PublishFile
from ._registry import StepRegistry
from ._steps import decode_manifest
from ._wal import decode_sequence
from ._watermarks import merge_watermarks, read_watermarks

# MD5s computed at once by the audit (local files: each read hashes a whole file).
_AUDIT_READS = 8
# The service areas' top folders, taken from the one layout module.
_STAGING_TOP = staging_prefix("j", "d").split("/", 1)[0]
_WAL_TOP = wal_prefix().rstrip("/")

ViolationKind = Literal[
    "unlisted_file",
    "missing_file",
    "wrong_size",
    "wrong_checksum",
    "listed_twice",
    "unreadable_manifest",
    "unreadable_watermarks",
    "unreadable_sequence",
    "staged_leftover",
    "unfinished_sequence",
    "quarantined_sequence",
    "watermark_behind",
    "missing_snapshot",
    "duplicate_snapshot",
    "snapshot_without_manifest",
    "table_files_differ",
    "unreadable_table",
]


class AuditViolation(msgspec.Struct, frozen=True, kw_only=True):
    """One breach: its kind, the object key it concerns, and a one-line explanation."""

    kind: ViolationKind
    key: str
    detail: str = ""


class AuditReport(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`audit` found, with the store's committed totals."""

    violations: list[AuditViolation]
    datasets: int
    manifests: int
    files: int
    bytes: int

    @property
    def ok(self) -> bool:
        """True when there is no violation."""
        return not self.violations

    def of_kind(self, kind: ViolationKind) -> list[AuditViolation]:
        """Return the violations of one kind."""
        return [v for v in self.violations if v.kind == kind]


async def _compare_computed(store: ObjectStore, files: list[tuple[str, str, str]]) -> list[AuditViolation]:
    """Compare listed MD5s with ``head_md5`` (computed on local files), a few reads at a time.

    A file whose store keeps no MD5 (S3 multipart...) still has None: it cannot be compared.
    """
    found: list[AuditViolation] = []

    async def one(item: tuple[str, str, str]) -> None:
        key, md5, manifest = item
        try:
            got = await store.head_md5(key)
        except NotFound:
            return  # deleted since the listing: the next audit reports it missing
        if got.checksum is not None and got.checksum.lower() != md5.lower():
            found.append(
                AuditViolation(
                    kind="wrong_checksum", key=key, detail=f"md5 {got.checksum}, {manifest} lists {md5}"
                )
            )

    await for_each_bounded(files, one, _AUDIT_READS)
    found.sort(key=lambda v: v.key)
    return found


async def audit(
    store: ObjectStore,
    *,
    ended_jobs: Iterable[str] = (),
    registry: StepRegistry | None = None,
    settings: Settings | None = None,
    tables: Mapping[str, str] | None = None,
) -> AuditReport:
    """List the whole store and check it (see the module doc).

    ``ended_jobs`` names jobs known to have ended (aborted or committed): any
    staged file of theirs is a leftover unless a sequence of theirs is open.
    ``settings`` (its ``tables`` catalog and bindings) and ``tables``
    (dataset -> table, more bindings) turn on the table checks.

    Returns:
        An :class:`AuditReport`; ``report.ok`` when the store is consistent.

    Raises:
        TransientError / OutcomeUnknown: from the store (run it again).
    """
    ended = set(ended_jobs)
    out: list[AuditViolation] = []
    published: dict[str, ObjectInfo] = {}
    manifest_keys: list[str] = []
    staged: list[ObjectInfo] = []
    wal_keys: list[str] = []
    datasets: set[str] = set()
    # Open sequences first: what they are publishing is theirs, not "unlisted".
    # Listed and read before the rest of the store, because a commit removes its
    # staged files before its WAL: a sequence found gone here had already
    # cleaned up before the listing below began, and one found here covers what
    # the listing sees of it (one pass in key order would list _staging/ before
    # _wal/ and could call a commit finishing in between a leftover).
    async for info in store.list(_WAL_TOP + "/"):
        wal_keys.append(info.key)
    in_flight: set[str] = set()
    bound: set[tuple[str, str]] = set()  # (dataset, table) of open sequences' table steps
    open_jobs: set[tuple[str, str]] = set()
    delta_tables: set[str] = set()
    for key in wal_keys:
        parts = key.split("/")
        if len(parts) != 3 or not parts[2].endswith(".json"):
            continue
        dataset, job = parts[1], parts[2][: -len(".json")]
        datasets.add(dataset)
        open_jobs.add((dataset, job))
        try:
            seq = decode_sequence((await store.read(key)).data, registry)
        except NotFound:
            open_jobs.discard((dataset, job))
            continue
        except CommitStepFailed as exc:
            out.append(AuditViolation(kind="unreadable_sequence", key=key, detail=str(exc)))
            continue
        in_flight.update(s.dst for s in seq.steps if isinstance(s, PublishFile))
        bound.update((s.dataset, s.table) for s in seq.steps if isinstance(s, CommitToTable))
        if seq.quarantined is not None:
            out.append(
                AuditViolation(
                    kind="quarantined_sequence",
                    key=key,
                    detail=f"attempts {seq.attempts}: {seq.quarantined}",
                )
            )
        else:
            out.append(
                AuditViolation(
                    kind="unfinished_sequence",
                    key=key,
                    detail=f"epoch {seq.epoch}, {len(seq.done)}/{len(seq.steps)} steps seen done",
                )
            )

    async for info in store.list(""):
        top, _, rest = info.key.partition("/")
        if top == _STAGING_TOP:
            staged.append(info)
        elif top == _WAL_TOP:
            continue  # listed and read first, above
        elif top.startswith(("_", ".")) or not rest:
            continue  # _state, _locks, other service areas: checked below or fine
        else:
            try:
                commits = commits_prefix(top)
            except BadInput:
                continue  # not a dataset folder
            datasets.add(top)
            if rest.startswith(DELTA_LOG + "/"):
                delta_tables.add(top)  # the Delta log: checked against the manifests below
            elif info.key.startswith(commits):
                name = info.key[len(commits) :]
                if name.endswith(".json") and "/" not in name:
                    manifest_keys.append(info.key)
            else:
                published[info.key] = info

    committed: set[tuple[str, str]] = set()
    parquet: dict[str, dict[str, list[str]]] = defaultdict(dict)  # dataset -> job -> its Parquet keys
    listed_by: dict[str, str] = {}
    marks: dict[str, dict[str, int]] = defaultdict(dict)
    files = 0
    total = 0
    unhashed: list[tuple[str, str, str]] = []  # (file, listed md5, manifest)
    for key in manifest_keys:
        dataset = key.split("/", 1)[0]
        try:
            manifest = decode_manifest((await store.read(key)).data, key)
        except NotFound:
            continue
        except CommitStepFailed as exc:
            out.append(AuditViolation(kind="unreadable_manifest", key=key, detail=str(exc)))
            continue
        committed.add((dataset, manifest.job))
        parquet[dataset][manifest.job] = [f.key for f in manifest.files if f.key.endswith(".parquet")]
        marks[dataset] = merge_watermarks(marks[dataset], manifest.watermarks)
        for f in manifest.files:
            files += 1
            total += f.size
            if f.key in listed_by:
                out.append(
                    AuditViolation(kind="listed_twice", key=f.key, detail=f"by {listed_by[f.key]} and {key}")
                )
                continue
            listed_by[f.key] = key
            got = published.get(f.key)
            if got is None:
                out.append(AuditViolation(kind="missing_file", key=f.key, detail=f"listed by {key}"))
            elif got.size != f.size:
                out.append(
                    AuditViolation(
                        kind="wrong_size", key=f.key, detail=f"{got.size} bytes, {key} lists {f.size}"
                    )
                )
            elif f.md5 and got.checksum is None:
                unhashed.append((f.key, f.md5, key))  # the listing gives no MD5: computed below
            elif f.md5 and got.checksum and got.checksum.lower() != f.md5.lower():
                out.append(
                    AuditViolation(
                        kind="wrong_checksum", key=f.key, detail=f"md5 {got.checksum}, {key} lists {f.md5}"
                    )
                )
    out.extend(await _compare_computed(store, unhashed))

    for key in sorted(published):
        if key not in listed_by and key not in in_flight:
            out.append(AuditViolation(kind="unlisted_file", key=key, detail="no manifest lists it"))

    for info in staged:
        try:
            parsed = parse_staged_key(info.key)
        except BadInput:
            continue  # not a staged file of the layout; not ours to judge
        if (parsed.dataset, parsed.job) in open_jobs:
            continue
        if (parsed.dataset, parsed.job) in committed or parsed.job in ended:
            out.append(
                AuditViolation(
                    kind="staged_leftover",
                    key=info.key,
                    detail=f"job {parsed.job} has ended for dataset {parsed.dataset}",
                )
            )

    for dataset in sorted(marks):
        wanted = marks[dataset]
        if not wanted:
            continue
        key = watermarks_key(dataset)
        try:
            current = await read_watermarks(store, dataset)
        except CommitStepFailed as exc:
            out.append(AuditViolation(kind="unreadable_watermarks", key=key, detail=str(exc)))
            continue
        for name, value in sorted(wanted.items()):
            if current.get(name, value - 1) < value:
                out.append(
                    AuditViolation(
                        kind="watermark_behind",
                        key=key,
                        detail=f"{name} is {current.get(name)}, a manifest committed {value}",
                    )
                )

    for dataset in sorted(delta_tables):
        found = await delta_violations(
            store,
            dataset,
            parquet.get(dataset, {}),
            {j for d, j in open_jobs if d == dataset},
            {k for k in published if k.startswith(f"{dataset}/")},
        )
        out = [v for v in out if not (v.kind == "missing_file" and v.key in found.may_be_missing)]
        for kind, key, detail in found.violations:
            out.append(AuditViolation(kind=kind, key=key, detail=detail))  # type: ignore[arg-type]

    if settings is not None:
        wanted_tables = {d: b.table for d, b in settings.tables.bindings.items() if not b.delta}
        wanted_tables.update(tables or {})
        wanted_tables.update(dict(bound))
        for kind, key, detail in await table_violations(
            settings, store.url, wanted_tables, committed, open_jobs
        ):
            out.append(AuditViolation(kind=kind, key=key, detail=detail))  # type: ignore[arg-type]

    return AuditReport(
        violations=out, datasets=len(datasets), manifests=len(committed), files=files, bytes=total
    )


__all__ = ["AuditReport", "AuditViolation", "ViolationKind", "audit"]
