"""Helpers for the table tests: real Parquet jobs, a real pyiceberg SQL catalog, read-backs into Arrow."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from shared.commit import (
    DATASET_PROPERTY,
    JOB_PROPERTY,
    CommitRequest,
    StagedFile,
    WinningAttempt,
    load_table,
    open_catalog,
    table_step,
)
from shared.events import FileStats, TableBinding, staged_key
from shared.settings import Settings, TablesSettings
from shared.spark import parquet_file_stats
from shared.storage import ObjectStore
from tests._support.commit import StagedJob, fast_settings
from tests._support.emulators import StoreTarget


def table_settings(target: StoreTarget, tmp: Path, **tables: Any) -> Settings:
    """Fast commit settings on ``target``; SQL catalog in the store (local), else SQLite in ``tmp``."""
    base = fast_settings()
    uri = "" if target.backend == "local" else f"sqlite:///{tmp}/catalog.db"
    return msgspec.structs.replace(
        base, store=target.settings, tables=TablesSettings(uri=uri, call_timeout=30.0, **tables)
    )


def rows(job: str, task: int, n: int, *, extra: bool = False) -> pa.Table:
    """``n`` distinct rows of one task of ``job`` (with ``extra``: one more column, a schema mismatch)."""
    cols: dict[str, Any] = {
        "id": pa.array([f"{job}/{task}/{i}" for i in range(n)], pa.string()),
        "amount": pa.array([task * 1000 + i for i in range(n)], pa.int64()),
    }
    if extra:
        cols["note"] = pa.array(["x"] * n, pa.string())
    return pa.table(cols)


@dataclass
class ParquetJob:
    """A staged job whose files are real Parquet, and the rows its winners hold."""

    staged: StagedJob
    rows: pa.Table

    @property
    def req(self) -> CommitRequest:
        return self.staged.req

    def step(self, binding: TableBinding) -> Any:
        return table_step(self.req, binding)


def parquet_with_stats(table: pa.Table, **write: Any) -> tuple[bytes, FileStats | None]:
    """Return ``table`` as Parquet bytes and the statistics a producer sends (from the footer written)."""
    buf = io.BytesIO()
    pq.write_table(table, buf, **write)
    body = buf.getvalue()
    return body, parquet_file_stats(pq.read_metadata(pa.BufferReader(body)))


async def stage_parquet_job(
    store: ObjectStore,
    dataset: str,
    job: str,
    *,
    tasks: int = 2,
    n: int = 3,
    extra: bool = False,
    stats: bool = False,
) -> ParquetJob:
    """Stage each task's winning attempt 1 (one Parquet file) and a losing attempt 0 of task 0.

    With ``stats``, each winner's StagedFile carries its statistics (as the Spark writer sends them).
    """
    winners: dict[str, bytes] = {}
    losers: dict[str, bytes] = {}
    attempts = []
    parts = []
    for task in range(tasks):
        t = rows(job, task, n, extra=extra)
        parts.append(t)
        body, found = parquet_with_stats(t)
        key = staged_key(job, dataset, task, 1, "part-0.parquet")
        await store.write(key, body)
        winners[key] = body
        staged = StagedFile(path="part-0.parquet", size=len(body), stats=found if stats else None)
        attempts.append(WinningAttempt(task=task, attempt=1, files=[staged]))
    buf = io.BytesIO()
    pq.write_table(rows(job, 0, n), buf)  # the loser's rows must never show in the table
    key = staged_key(job, dataset, 0, 0, "part-0.parquet")
    await store.write(key, buf.getvalue())
    losers[key] = buf.getvalue()
    req = CommitRequest(dataset=dataset, job=job, winners=attempts, expected_tasks=tasks)
    return ParquetJob(StagedJob(req=req, winners=winners, losers=losers), pa.concat_tables(parts))


def table_rows(settings: Settings, store_url: str, table: str) -> pa.Table | None:
    """Return the table's rows read back with pyiceberg (sorted by id), or None when there is no table."""
    tbl = load_table(open_catalog(settings, store_url), table)
    if tbl is None:
        return None
    return tbl.scan().to_arrow().select(["id", "amount"]).sort_by("id")


def job_snapshots(settings: Settings, store_url: str, table: str) -> list[tuple[str, str]]:
    """Return ``(dataset, job)`` of every snapshot of the table, oldest first."""
    tbl = load_table(open_catalog(settings, store_url), table)
    assert tbl is not None
    return [
        (s.summary.get(DATASET_PROPERTY, ""), s.summary.get(JOB_PROPERTY, ""))
        for s in tbl.metadata.snapshots
        if s.summary is not None
    ]


def sorted_rows(*tables: pa.Table) -> pa.Table:
    """The rows of ``tables`` together, sorted like :func:`table_rows`."""
    return pa.concat_tables(tables).sort_by("id")
