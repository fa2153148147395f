"""Helpers for the Delta table tests: staged Parquet jobs, and read-backs with delta-rs (``deltalake``).

delta-rs reads the table where it is on local files, the S3 emulator (moto) and the Azure emulator
(Azurite); on the GCS emulator it reads a copy on local disk made through the store port (delta-rs'
object_store speaks GCS's XML API, which fake-gcs-server is not known to serve: arrow-rs issue 5263), so
every check reads the log as a Delta reader does.
"""

from __future__ import annotations

import io
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from shared.commit import CommitRequest, StagedFile, WinningAttempt, table_step
from shared.events import TableBinding, staged_key
from shared.storage import ObjectStore
from tests._support.commit import StagedJob
from tests._support.emulators import DUMMY_AWS_ENV, StoreTarget
from tests._support.tables import parquet_with_stats, rows


@dataclass
class DeltaJob:
    """A staged job whose winning files are real Parquet, and the rows they hold."""

    staged: StagedJob
    rows: pa.Table

    @property
    def req(self) -> CommitRequest:
        return self.staged.req

    def step(self, mode: str = "append") -> Any:
        return table_step(self.req, TableBinding(delta=True, mode=mode))  # type: ignore[arg-type]


async def stage_delta_job(
    store: ObjectStore,
    dataset: str,
    job: str,
    *,
    tasks: int = 2,
    n: int = 3,
    extra: bool = False,
    folder: str = "",
) -> DeltaJob:
    """Stage each task's winning attempt 1 (a Parquet file, in ``folder`` if given) and a losing attempt 0."""
    winners: dict[str, bytes] = {}
    losers: dict[str, bytes] = {}
    attempts = []
    parts = []
    rel = f"{folder}/part-0.parquet" if folder else "part-0.parquet"
    for task in range(tasks):
        t = rows(job, task, n, extra=extra)
        parts.append(t)
        body = _parquet(t)
        key = staged_key(job, dataset, task, 1, rel)
        await store.write(key, body)
        winners[key] = body
        attempts.append(WinningAttempt(task=task, attempt=1, files=[StagedFile(path=rel, size=len(body))]))
    body = _parquet(rows(job, 0, n))  # the loser's rows must never show in the table
    key = staged_key(job, dataset, 0, 0, rel)
    await store.write(key, body)
    losers[key] = body
    req = CommitRequest(dataset=dataset, job=job, winners=attempts, expected_tasks=tasks)
    return DeltaJob(StagedJob(req=req, winners=winners, losers=losers), pa.concat_tables(parts))


async def stage_tables_job(
    store: ObjectStore, dataset: str, job: str, tables: list[pa.Table], *, stats: bool, **write: Any
) -> DeltaJob:
    """Stage one winning Parquet file per table of ``tables`` (task i holds ``tables[i]``).

    With ``stats``, each StagedFile carries the statistics a producer sends (taken from the footer
    written, as the Spark writer takes them); ``write``: pyarrow's ``write_table`` options.
    """
    winners: dict[str, bytes] = {}
    attempts = []
    for task, t in enumerate(tables):
        body, found = parquet_with_stats(t, **write)
        assert found is not None or not stats, t.schema
        key = staged_key(job, dataset, task, 0, "part-0.parquet")
        await store.write(key, body)
        winners[key] = body
        staged = StagedFile(path="part-0.parquet", size=len(body), stats=found if stats else None)
        attempts.append(WinningAttempt(task=task, attempt=0, files=[staged]))
    req = CommitRequest(dataset=dataset, job=job, winners=attempts, expected_tasks=len(tables))
    return DeltaJob(StagedJob(req=req, winners=winners, losers={}), pa.concat_tables(tables))


def _parquet(t: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(t, buf)
    return buf.getvalue()


def local_root(store: ObjectStore) -> Path | None:
    """Return the folder of a local store's root, else None."""
    if not store.url.startswith("file://"):
        return None
    return Path(unquote(urlsplit(store.url).path))


def s3_options(target: StoreTarget) -> dict[str, str]:
    """delta-rs storage options for the S3 emulator of ``target``."""
    return {
        "AWS_ENDPOINT_URL": target.settings.s3_endpoint_url or "",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": DUMMY_AWS_ENV["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": DUMMY_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        "AWS_REGION": DUMMY_AWS_ENV["AWS_DEFAULT_REGION"],
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }


def azure_options(target: StoreTarget) -> dict[str, str]:
    """delta-rs storage options for the Azure emulator (Azurite) of ``target``."""
    parts = dict(
        p.split("=", 1) for p in target.settings.azure_connection_string.reveal().split(";") if "=" in p
    )
    return {
        "account_name": parts["AccountName"],
        "account_key": parts["AccountKey"],
        "endpoint": parts["BlobEndpoint"].rstrip("/"),
        "allow_http": "true",
    }


async def open_delta(store: ObjectStore, target: StoreTarget, dataset: str, tmp: Path) -> DeltaTable:
    """Open ``<store root>/<dataset>`` with delta-rs: in place on local files, S3 and Azure; else a copy."""
    root = local_root(store)
    if root is not None:
        return DeltaTable(str(root / dataset))
    if target.backend == "s3":
        return DeltaTable(f"{store.url.rstrip('/')}/{dataset}", storage_options=s3_options(target))
    if target.backend == "azure":
        return DeltaTable(f"{store.url.rstrip('/')}/{dataset}", storage_options=azure_options(target))
    dest = tmp / f"copy-{secrets.token_hex(4)}" / dataset
    prefix = f"{dataset}/"
    async for info in store.list(prefix):
        path = dest / info.key[len(prefix) :]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((await store.read(info.key)).data)
    return DeltaTable(str(dest))


def delta_rows(dt: DeltaTable) -> pa.Table:
    """Return the table's rows (``id``, ``amount``) sorted by id, read by delta-rs."""
    return pa.table(dt.to_pyarrow_table()).select(["id", "amount"]).sort_by("id")


def delta_jobs(dt: DeltaTable) -> list[tuple[int, str]]:
    """Return ``(version, job)`` of every fleet commit in the table's history, oldest first."""
    out = []
    for h in dt.history():
        info = h.get("commitfleet")
        if isinstance(info, dict):
            out.append((int(h["version"]), str(info["job"])))
    return sorted(out)


async def log_names(store: ObjectStore, dataset: str) -> list[str]:
    """Return the file names in ``<dataset>/_delta_log/``, sorted."""
    prefix = f"{dataset}/_delta_log/"
    return sorted([info.key[len(prefix) :] async for info in store.list(prefix)])


def sorted_rows(*tables: pa.Table) -> pa.Table:
    """The rows of ``tables`` together, sorted like :func:`delta_rows`."""
    return pa.concat_tables(tables).sort_by("id")
