"""The Iceberg step's commit path: background uploads, the SQL catalog's kept metadata and commit on its read.

The manifests and the manifest list are uploaded in the background while
pyiceberg goes on; the catalog's pointer must move only after every upload
ended, and a failed upload must fail the commit and leave the table as it was.
The SQL catalog keeps parsed metadata by location and commits on the table the
step read: another writer's commit in between must still be seen (it is a new
location), and what is kept must be what the file says.
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.serializers import FromInputFile

from shared import TransientError
from shared.commit import (
    StepContext,
    TableFileIO,
    catalog_properties,
    commit_dataset,
    load_table,
    open_catalog,
)
from shared.commit._catalog_ops import commit_files, prepare_append
from shared.commit._table_io import local_path
from shared.events import TableBinding, published_key, staged_key
from shared.settings import Settings, StoreSettings
from shared.storage import ObjectStore
from tests._support.commit import ManualLease
from tests._support.emulators import StoreTarget
from tests._support.gated_iceberg import GATE
from tests._support.tables import ParquetJob, job_snapshots, rows, sorted_rows, stage_parquet_job, table_rows
from tests._support.tables import table_settings as _table_settings
from tests._support.wait import wait_for

TABLE = "lake.orders"
GATED = {"py-io-impl": "tests._support.gated_iceberg.GatedFileIO"}


@pytest.fixture
def gate() -> Iterator[None]:
    GATE.reset()
    yield
    GATE.release.set()
    GATE.reset()


def _settings(tmp: Path) -> tuple[StoreTarget, Settings]:
    target = StoreTarget("local", (tmp / "store").as_uri(), StoreSettings())
    return target, _table_settings(target, tmp, properties=GATED)


async def _published(store: ObjectStore, dataset: str, job: str) -> ParquetJob:
    """A staged job whose winners are published as a commit does before its table step."""
    staged = await stage_parquet_job(store, dataset, job, stats=True)
    for w in staged.req.winners:
        for f in w.files:
            src = staged_key(job, dataset, w.task, w.attempt, f.path)
            await store.copy(src, published_key(dataset, job, w.task, f.path))
    return staged


@pytest.fixture
async def table(tmp_path: Path) -> AsyncIterator[tuple[ObjectStore, Settings, ParquetJob]]:
    """The store, its settings, and the table made by a first job's commit."""
    target, settings = _settings(tmp_path)
    async with target.open() as store:
        first = await stage_parquet_job(store, "orders", "job-0", stats=True)
        step = first.step(TableBinding(table=TABLE, mode="create"))
        res = await commit_dataset(store, first.req, ManualLease("orders", 1), settings, extra_steps=[step])
        assert res.ok, res
        yield store, settings, first


def _location(settings: Settings, url: str) -> str:
    tbl = load_table(open_catalog(settings, url), TABLE)
    assert tbl is not None
    return tbl.metadata_location


async def test_the_catalog_moves_only_after_every_upload_and_they_run_with_the_metadata_file(
    gate: None, table: tuple[ObjectStore, Settings, ParquetJob]
) -> None:
    store, settings, first = table
    before = _location(settings, store.url)
    job = await _published(store, "orders", "job-1")
    step = job.step(TableBinding(table=TABLE, mode="append"))
    GATE.reset()  # forget the first commit's uploads
    GATE.hold = lambda name: name.startswith("snap-")  # the manifest list's upload waits
    ctx = StepContext(store=store, lease=ManualLease("orders", 2), settings=settings)
    landing = asyncio.create_task(step.ensure(ctx))

    # The new metadata file is written while the manifest list's upload is still held...
    async def metadata_written() -> bool:
        return any(n.endswith(".metadata.json") for n in GATE.names()) or landing.done()

    await wait_for(metadata_written, interval=0.005, what="the new metadata file's upload")
    assert not landing.done(), landing
    assert any(n.startswith("snap-") for n in GATE.names())
    # ...and the catalog still points at the table before the commit.
    assert _location(settings, store.url) == before
    assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-0")]
    GATE.release.set()
    assert await landing is True
    assert _location(settings, store.url) != before
    assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-0"), ("orders", "job-1")]
    assert table_rows(settings, store.url, TABLE) == sorted_rows(first.rows, job.rows)


@pytest.mark.parametrize("which", ["manifest", "manifest list", "metadata file"])
async def test_a_failed_upload_fails_the_commit_and_leaves_the_table_then_the_retry_lands_once(
    gate: None, table: tuple[ObjectStore, Settings, ParquetJob], which: str
) -> None:
    store, settings, first = table
    before = _location(settings, store.url)
    job = await _published(store, "orders", "job-1")
    step = job.step(TableBinding(table=TABLE, mode="append"))
    if which == "manifest":
        GATE.fail = lambda name: name.endswith("-m0.avro")
    elif which == "manifest list":
        GATE.fail = lambda name: name.startswith("snap-")
    else:  # the lean append uploads it in the background too (_sql_catalog.stage_commit)
        GATE.fail = lambda name: name.endswith(".metadata.json")
    ctx = StepContext(store=store, lease=ManualLease("orders", 2), settings=settings)
    with pytest.raises(TransientError, match="failed \\(test\\)"):
        await step.ensure(ctx)
    assert _location(settings, store.url) == before
    assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-0")]
    (failed,) = GATE.failed
    assert not TableFileIO({}).new_input(failed).exists()  # not answered from memory either
    assert await step.ensure(ctx) is True
    assert job_snapshots(settings, store.url, TABLE) == [("orders", "job-0"), ("orders", "job-1")]
    assert table_rows(settings, store.url, TABLE) == sorted_rows(first.rows, job.rows)


async def test_another_writers_commit_in_between_is_read_and_the_kept_metadata_is_the_files(
    table: tuple[ObjectStore, Settings, ParquetJob],
) -> None:
    store, settings, first = table
    kept = load_table(open_catalog(settings, store.url), TABLE)
    assert kept is not None
    assert copy.deepcopy(kept.metadata) is kept.metadata  # shared, not copied, by pyiceberg's updates
    dumped = kept.metadata.model_dump_json()
    # Another writer (pyiceberg's own SQL catalog) appends between two fleet commits.
    props = {k: v for k, v in catalog_properties(settings, store.url).items() if k != "py-io-impl"}
    other = SqlCatalog(settings.tables.name, **props).load_table(TABLE)
    other.append(rows("other", 0, 2))
    job = await _published(store, "orders", "job-1")
    step = job.step(TableBinding(table=TABLE, mode="append"))
    ctx = StepContext(store=store, lease=ManualLease("orders", 2), settings=settings)
    assert await step.ensure(ctx) is True
    assert [s for s in job_snapshots(settings, store.url, TABLE) if s[1]] == [
        ("orders", "job-0"),
        ("orders", "job-1"),
    ]
    assert len(job_snapshots(settings, store.url, TABLE)) == 3
    assert table_rows(settings, store.url, TABLE) == sorted_rows(first.rows, rows("other", 0, 2), job.rows)
    assert kept.metadata.model_dump_json() == dumped  # the metadata it was based on is unchanged
    now = load_table(open_catalog(settings, store.url), TABLE)
    assert now is not None
    parsed = FromInputFile.table_metadata(PyArrowFileIO().new_input(now.metadata_location))
    assert now.metadata.model_dump() == parsed.model_dump()


async def test_every_file_a_local_table_points_at_is_fsynced_with_its_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyiceberg's local file IO writes without fsync; the catalog's commit is durable (power cuts)."""
    synced: set[str] = set()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target, settings = _settings(tmp_path)
    async with target.open() as store:
        for i, mode in enumerate(["create", "append", "append"]):
            job = await stage_parquet_job(store, "orders", f"job-{i}", stats=i == 2)
            step = job.step(TableBinding(table=TABLE, mode=mode))  # type: ignore[arg-type]
            res = await commit_dataset(
                store, job.req, ManualLease("orders", i + 1), settings, extra_steps=[step]
            )
            assert res.ok, res
        tbl = load_table(open_catalog(settings, store.url), TABLE)
        assert tbl is not None
    local = [tbl.metadata_location] + [u for m in tbl.metadata.metadata_log for u in [m.metadata_file]]
    for snap in tbl.metadata.snapshots:
        local.append(snap.manifest_list)
        local += [m.manifest_path for m in snap.manifests(tbl.io)]
    paths = {local_path(u) for u in local}
    assert None not in paths and len(paths) >= 9
    missing = {p for p in paths if p not in synced}
    assert not missing, missing
    folder = os.path.dirname(next(iter(p for p in paths if p)))
    for above in (folder, os.path.dirname(folder), os.path.dirname(os.path.dirname(folder))):
        assert above in synced, above


async def test_a_prepared_append_after_another_writers_commit_lands_once_on_top_of_it(
    table: tuple[ObjectStore, Settings, ParquetJob],
) -> None:
    store, settings, first = table
    job = await _published(store, "orders", "job-1")
    step = job.step(TableBinding(table=TABLE, mode="append"))
    cat = open_catalog(settings, store.url)
    uris = step.uris(store.url)
    prepared = await asyncio.to_thread(prepare_append, cat, TABLE, "append", "orders", "job-1", uris)
    assert prepared is not None
    staged_location = prepared.commit.location
    # Another writer (pyiceberg's own SQL catalog) appends between the preparation and its turn.
    props = {k: v for k, v in catalog_properties(settings, store.url).items() if k != "py-io-impl"}
    SqlCatalog(settings.tables.name, **props).load_table(TABLE).append(rows("other", 0, 2))

    def land() -> bool:
        return commit_files(cat, TABLE, "append", "orders", "job-1", uris, lambda: None, prepared=prepared)

    assert await asyncio.to_thread(land) is True
    assert [s for s in job_snapshots(settings, store.url, TABLE) if s[1]] == [
        ("orders", "job-0"),
        ("orders", "job-1"),
    ]
    assert len(job_snapshots(settings, store.url, TABLE)) == 3
    assert table_rows(settings, store.url, TABLE) == sorted_rows(first.rows, rows("other", 0, 2), job.rows)
    assert _location(settings, store.url) != staged_location  # the prepared file stays an orphan
    # Landed: a second prepared commit of the same job finds it and adds nothing.
    again = await asyncio.to_thread(prepare_append, cat, TABLE, "append", "orders", "job-1", uris)
    assert again is None
