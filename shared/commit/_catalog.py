"""The table step: a bound dataset's commit lands as exactly one Iceberg snapshot.

:class:`CommitToTable` runs in the ``apply`` phase, so after every file is
published (and the log fenced) and before the manifest: the snapshot is the
point of visibility for table readers, the manifest still proves the whole
commit. Abort never runs it (an aborted job has no sequence), so abort never
touches the table.

Done means: a snapshot of the table carries this job's ``commitfleet.job``
and ``commitfleet.dataset`` properties. ``ensure`` reads the table, and when
the job is not there, commits one transaction based on that read
(``append``: as pyiceberg's ``add_files``; ``create``: the table created from the
first file's Parquet schema together with the append, so a job that never
gets here leaves no table; ``overwrite``: every current data file replaced by
the job's, in one snapshot). A stale holder and a new one can never both land:
the later commit fails the catalog's requirement, re-reads, and finds the job
done (see :mod:`._catalog_ops`). The files' data files are built from the
statistics their producers sent (``described``, kept in the log with the
step), else from their footers as ``add_files`` does (:mod:`._table_files`).

pyiceberg blocks; its calls run in a thread. On cancel the step waits (up to
``tables.call_timeout``) for the call in flight, so a holder that stopped
makes no change afterwards; whatever the call did, the next holder's check
reads it from the catalog (recovery verifies every step).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import msgspec

from .._errors import CommitfleetError
from ..events import StreamBatch, TableBinding
from ..settings import Settings, TableMode
from ._catalog_ops import (
    STREAM_APP_PROPERTY,
    STREAM_BATCH_PROPERTY,
    STREAM_QUERY_PROPERTY,
    PreparedAppend,
    classify,
    commit_files,
    job_snapshot,
    load_table,
    open_catalog,
    prepare_append,
)
from ._delta import CommitToDelta, delta_step
from ._model import CommitRequest
from ._steps import CommitStep, Phase, StepContext
from ._table_files import DescribedFile, winner_parquet_files

T = TypeVar("T")


def _guarded(fn: Callable[[], T], what: str) -> Callable[[], T]:
    """Return ``fn`` with every failure that is not ours turned into a commitfleet error (see classify)."""

    def run() -> T:
        try:
            return fn()
        except CommitfleetError:
            raise
        except Exception as exc:  # pyiceberg, SQLAlchemy, the store SDKs: classified, never swallowed
            raise classify(exc, what) from exc

    return run


async def in_thread(fn: Callable[[], T], wait_on_cancel: float) -> T:
    """Run the blocking ``fn`` in a thread and return its result.

    Raises: what ``fn`` raises. On cancel: waits up to ``wait_on_cancel``
    seconds for ``fn`` to end (it cannot be interrupted), then re-raises.
    """
    fut = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        # No change of this holder may land after it stopped: let the call end first.
        await asyncio.wait({fut}, timeout=wait_on_cancel)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise


class CommitToTable(CommitStep, frozen=True, kw_only=True, tag="table"):
    """Land the job's published Parquet files (``files``: store keys) as one snapshot of ``table``."""

    phase: ClassVar[Phase] = "apply"
    prepares: ClassVar[bool] = True

    dataset: str
    job: str
    table: str
    mode: TableMode = "append"
    files: list[str]
    stream: StreamBatch | None = None
    # The files' verified sizes and their producers' statistics, by store key (those that sent them).
    described: dict[str, DescribedFile] = msgspec.field(default_factory=dict)

    def summary(self) -> dict[str, str]:
        """Return the snapshot summary properties this step adds besides the job's (a streaming batch's)."""
        if self.stream is None:
            return {}
        return {
            STREAM_APP_PROPERTY: self.stream.app_id,
            STREAM_BATCH_PROPERTY: str(self.stream.batch),
            STREAM_QUERY_PROPERTY: self.stream.query,
        }

    def uris(self, store_url: str) -> list[str]:
        """Return the files' full URIs under the store root ``store_url``."""
        root = store_url.rstrip("/")
        return [f"{root}/{key}" for key in self.files]

    def described_uris(self, store_url: str) -> dict[str, DescribedFile]:
        """Return :attr:`described` keyed by the files' full URIs under ``store_url``."""
        root = store_url.rstrip("/")
        return {f"{root}/{key}": known for key, known in self.described.items()}

    def _write(self, store_url: str) -> dict[str, Any]:
        """Return what :func:`prepare_append` and :func:`commit_files` write, by their parameters' names."""
        return {
            "table": self.table,
            "mode": self.mode,
            "dataset": self.dataset,
            "job": self.job,
            "paths": self.uris(store_url),
            "extra_properties": self.summary(),
            "described": self.described_uris(store_url),
        }

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when a snapshot of the table carries this job's commit of the dataset.

        Raises:
            CommitStepFailed: pyiceberg missing or the catalog misconfigured.
            TransientError / OutcomeUnknown: the catalog failed.
        """
        settings, url = ctx.settings, ctx.store.url

        def check() -> bool:
            tbl = load_table(open_catalog(settings, url), self.table)
            return tbl is not None and job_snapshot(tbl, self.dataset, self.job) is not None

        return await in_thread(_guarded(check, f"table {self.table}"), settings.tables.call_timeout)

    async def execute(self, ctx: StepContext) -> None:
        """Land the snapshot unless it is there. Raises as :meth:`ensure`."""
        await self.ensure(ctx)

    async def prepare(self, ctx: StepContext) -> PreparedAppend | None:
        """Stage an append's snapshot and write its files, no pointer moved (:func:`prepare_append`).

        Returns None where that does not serve (an overwrite, another
        catalog, the table missing, the snapshot there). Raises: as :meth:`ensure`.
        Cancelled: waits for the catalog's thread as :meth:`ensure` does.
        """
        if self.mode == "overwrite":
            return None
        settings, url = ctx.settings, ctx.store.url

        def stage() -> PreparedAppend | None:
            return prepare_append(open_catalog(settings, url), **self._write(url))

        return await in_thread(_guarded(stage, f"table {self.table}"), settings.tables.call_timeout)

    async def ensure(self, ctx: StepContext) -> bool:
        """Check and commit in one optimistic transaction based on the read (see the module doc).

        Returns:
            True when this call landed the snapshot, False when it was there.

        Raises:
            CommitStepFailed: bad input (schema mismatch, table missing in
                append/overwrite, nothing to create from): quarantine.
            TransientError: lost to another job's concurrent commit, or the
                catalog failed; the retry re-checks.
            OutcomeUnknown: the catalog could not say; the retry re-checks.
            LockLost / Fenced: the lease, checked just before the commit.
        """
        settings, url = ctx.settings, ctx.store.url
        found = await ctx.head_starts.take(self)
        prepared = found if isinstance(found, PreparedAppend) else None
        ctx.lease.check()

        def land() -> bool:
            cat = open_catalog(settings, url)
            ctx.probe("table.commit")
            landed = commit_files(cat, check=ctx.lease.check, prepared=prepared, **self._write(url))
            ctx.probe("table.committed")
            return landed

        return await in_thread(_guarded(land, f"table {self.table}"), settings.tables.call_timeout)


def resolve_binding(
    settings: Settings, dataset: str, job_tables: Mapping[str, TableBinding] | None = None
) -> TableBinding | None:
    """Return the dataset's binding: the job's own (``job_started``), else the fleet's settings, else None."""
    if job_tables and dataset in job_tables:
        return job_tables[dataset]
    fleet = settings.tables.bindings.get(dataset)
    if fleet is None:
        return None
    if fleet.delta:
        return TableBinding(delta=True, mode=fleet.mode)
    return TableBinding(table=fleet.table, mode=fleet.mode)


def table_step(req: CommitRequest, binding: TableBinding) -> CommitToTable | CommitToDelta:
    """Return the table step of ``req``: its winners' published Parquet files (named as by plan_commit).

    A Delta binding gets the Delta step (:mod:`._delta`), an Iceberg binding the catalog step.
    Files whose producer sent statistics carry them (with their size), so the
    Iceberg step describes them to the table without reading their footers.
    """
    if binding.delta or binding.table is None:
        return delta_step(req, binding)
    files, described = winner_parquet_files(req)
    return CommitToTable(
        dataset=req.dataset,
        job=req.job,
        table=binding.table,
        mode=binding.mode,
        files=files,
        stream=req.stream,
        described=described,
    )


__all__ = ["CommitToTable", "TableBinding", "in_thread", "resolve_binding", "table_step"]
