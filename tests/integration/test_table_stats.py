"""File statistics sent with a staged file give the same Iceberg data file as pyiceberg's footer read.

Each file is written by pyarrow, its statistics taken from the footer as the
Spark writer takes them, sent through the contract (encoded, decoded and
validated as on intake), and turned into a data file by the table step's
builder; pyiceberg's ``parquet_file_to_data_file`` reads the same file's
footer. The two must agree field for field, for every column type of the
contract, under each metrics mode, on a partitioned table too, and through a
whole commit (the manifests' entries of two tables, one committed each way).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared.commit import commit_dataset, data_file_from_stats, load_table, open_catalog, table_step
from shared.events import (
    MAX_BOUND_CHARS,
    FileStats,
    StagedFile,
    TableBinding,
    TaskFinished,
    ValidationLimits,
    decode_event,
    encode_event,
)
from shared.spark import parquet_file_stats
from tests._support.commit import ManualLease
from tests._support.emulators import MakeTarget
from tests._support.manifest_files import data_file_fields
from tests._support.tables import job_snapshots, stage_parquet_job, table_settings

LONG = "ü" * (MAX_BOUND_CHARS + 9)


def rich_table(rows: int = 40) -> pa.Table:
    """Every type of the contract, nulls, a NaN and infinities, strings and bytes longer than a bound."""
    base = dt.datetime(2024, 2, 29, 23, 59, 58, 123456)
    columns: dict[str, tuple[pa.DataType, list[Any]]] = {
        "i8": (pa.int8(), [-5, None, 7]),
        "i16": (pa.int16(), [300, -300]),
        "i32": (pa.int32(), [2**31 - 1, -(2**31), None]),
        "i64": (pa.int64(), [2**63 - 1, -(2**63), 0]),
        "u8": (pa.uint8(), [0, 255]),
        "f32": (pa.float32(), [1.5, -math.inf, None, math.nan]),
        "f64": (pa.float64(), [0.1, math.inf, -2.5e300, math.nan]),
        "dec_small": (pa.decimal128(5, 2), [Decimal("1.20"), Decimal("-3.45"), None]),
        "dec_big": (pa.decimal128(22, 4), [Decimal("12345678901234567.8901"), Decimal("-0.0001")]),
        "s": (pa.string(), ["b", "a" + LONG, None, "ÿ" + LONG, "é"]),
        "s_short": (pa.large_string(), ["x", "yy", "abcdefghijklmnopqrstu"]),
        "b": (pa.binary(), [b"\x00\xff", b"\xfe" * (MAX_BOUND_CHARS + 3), None]),
        "fx": (pa.binary(4), [b"abcd", b"\x00\x01\x02\x03"]),
        "d": (pa.date32(), [dt.date(1969, 12, 31), dt.date(2038, 1, 19), None]),
        "t": (pa.time64("us"), [dt.time(0, 0), dt.time(23, 59, 59, 999999)]),
        "ts_s": (pa.timestamp("s"), [base.replace(microsecond=0)]),
        "ts_ms": (pa.timestamp("ms"), [base.replace(microsecond=123000), None]),
        "ts": (pa.timestamp("us"), [base, dt.datetime(1900, 1, 1)]),
        "tstz": (pa.timestamp("us", tz="UTC"), [base.replace(tzinfo=dt.UTC), None]),
        "bo": (pa.bool_(), [True, None, False]),
        "nothing": (pa.int64(), [None]),
    }
    arrays = {name: pa.array([v[i % len(v)] for i in range(rows)], t) for name, (t, v) in columns.items()}
    fields = [pa.field(name, t) for name, (t, _) in columns.items()]
    fields.append(pa.field("req", pa.int64(), nullable=False))
    arrays["req"] = pa.array(range(rows), pa.int64())
    return pa.table(arrays, schema=pa.schema(fields))


def write_file(path: Path, table: pa.Table, **write: Any) -> FileStats:
    """Write ``table`` to ``path``; return its statistics, after a trip through the contract (intake's)."""
    pq.write_table(table, path, **write)
    found = parquet_file_stats(pq.read_metadata(path))
    assert found is not None
    ev = TaskFinished(
        job="j1",
        dataset="d1",
        task=0,
        attempt=0,
        files=[StagedFile(path="part-0.parquet", size=path.stat().st_size, stats=found)],
        finished_at=time.time(),
    )
    back = decode_event(encode_event(ev), sig=None, limits=ValidationLimits())
    assert isinstance(back, TaskFinished) and back.files[0].stats == found
    return found


def sql_catalog(tmp: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("t", uri=f"sqlite:///{tmp}/cat.db", warehouse=(tmp / "wh").as_uri())
    cat.create_namespace("ns")
    return cat


def fields_of(df: Any) -> dict[str, Any]:
    return data_file_fields(df)


@pytest.mark.parametrize(
    ("properties", "falls_back"),
    [
        ({}, False),  # truncate(16), pyiceberg's default
        ({"write.metadata.metrics.default": "truncate(63)"}, False),
        ({"write.metadata.metrics.default": "truncate(64)"}, True),  # the cut bounds are too short
        ({"write.metadata.metrics.default": "full"}, True),
        ({"write.metadata.metrics.default": "counts"}, False),
        ({"write.metadata.metrics.default": "none"}, False),
        ({"write.metadata.metrics.default": "none", "write.metadata.metrics.column.s": "truncate(4)"}, False),
        ({"write.metadata.metrics.column.s": "full", "write.metadata.metrics.column.b": "counts"}, True),
        ({"write.metadata.metrics.column.s": "counts", "write.metadata.metrics.column.b": "none"}, False),
    ],
)
def test_a_data_file_from_stats_equals_the_footer_read(
    tmp_path: Path, properties: dict[str, str], falls_back: bool
) -> None:
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    table = rich_table()
    path = tmp_path / "f.parquet"
    stats = write_file(path, table, row_group_size=7)  # several row groups to sum
    assert len(stats.offsets) == 6
    assert stats.columns["s"].lower_cut and stats.columns["s"].upper_cut and stats.columns["b"].upper_cut
    tbl = sql_catalog(tmp_path).create_table("ns.t", table.schema, properties=properties)
    uri = path.as_uri()
    footer = parquet_file_to_data_file(tbl.io, tbl.metadata, uri)
    built = data_file_from_stats(tbl.metadata, uri, path.stat().st_size, stats)
    if falls_back:
        assert built is None
        return
    assert built is not None
    assert fields_of(built) == fields_of(footer)
    if not properties:  # the default mode has bounds to compare: they are there and equal
        assert len(footer.lower_bounds) >= 18 and len(footer.null_value_counts) == len(table.columns)


def test_a_partitioned_table_infers_the_same_partition(tmp_path: Path) -> None:
    from pyiceberg.io.pyarrow import parquet_file_to_data_file
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, IdentityTransform

    table = pa.table(
        {
            "region": pa.array(["eu"] * 5),
            "at": pa.array(
                [dt.datetime(2024, 5, 1, h, tzinfo=dt.UTC) for h in range(5)], pa.timestamp("us", "UTC")
            ),
            "n": pa.array(range(5), pa.int64()),
        }
    )
    path = tmp_path / "p.parquet"
    stats = write_file(path, table)
    cat = sql_catalog(tmp_path)
    tbl = cat.create_table("ns.p", table.schema)
    ids = {f.name: f.field_id for f in tbl.schema().fields}
    spec = PartitionSpec(
        PartitionField(source_id=ids["region"], field_id=1000, transform=IdentityTransform(), name="region"),
        PartitionField(source_id=ids["at"], field_id=1001, transform=DayTransform(), name="at_day"),
    )
    tbl = cat.create_table("ns.p2", tbl.schema(), partition_spec=spec)
    uri = path.as_uri()
    footer = parquet_file_to_data_file(tbl.io, tbl.metadata, uri)
    built = data_file_from_stats(tbl.metadata, uri, path.stat().st_size, stats)
    assert built is not None
    assert fields_of(built) == fields_of(footer)
    assert footer.partition[0] == "eu"


def test_a_file_the_table_cannot_take_raises_as_the_footer_read_does(tmp_path: Path) -> None:
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    cat = sql_catalog(tmp_path)
    base = pa.table({"id": pa.array(["a"]), "n": pa.array([1], pa.int64())})
    tbl = cat.create_table("ns.t", base.schema)
    cases = {
        "more_columns": pa.table({"id": ["a"], "n": pa.array([1], pa.int64()), "x": ["y"]}),
        "narrower_type": pa.table({"id": ["a"], "n": pa.array([1.5], pa.float64())}),
    }
    for name, bad in cases.items():
        path = tmp_path / f"{name}.parquet"
        stats = write_file(path, bad)
        with pytest.raises(ValueError) as footer_error:
            parquet_file_to_data_file(tbl.io, tbl.metadata, path.as_uri())
        with pytest.raises(ValueError) as stats_error:
            data_file_from_stats(tbl.metadata, path.as_uri(), path.stat().st_size, stats)
        assert type(stats_error.value) is type(footer_error.value), name
    # A required column in the table that the file leaves optional: refused both ways too.
    strict = cat.create_table("ns.strict", pa.schema([pa.field("id", pa.string(), nullable=False)]))
    path = tmp_path / "optional.parquet"
    stats = write_file(path, pa.table({"id": ["a"]}))
    with pytest.raises(ValueError):
        parquet_file_to_data_file(strict.io, strict.metadata, path.as_uri())
    with pytest.raises(ValueError):
        data_file_from_stats(strict.metadata, path.as_uri(), path.stat().st_size, stats)


def test_a_nested_or_unsupported_column_sends_no_stats(tmp_path: Path) -> None:
    for table in (
        pa.table({"id": [1], "tags": pa.array([["a", "b"]])}),
        pa.table({"id": [1], "s": pa.array([{"x": 1}])}),
        pa.table({"id": pa.array([1], pa.uint32())}),
        pa.table({"ts": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("ns"))}),
        pa.table({"ts": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us", tz="Europe/Paris"))}),
    ):
        path = tmp_path / "n.parquet"
        pq.write_table(table, path)
        assert parquet_file_stats(pq.read_metadata(path)) is None, table.schema


async def test_a_commit_with_stats_lands_the_same_manifest_entries_as_one_without(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    """The same staged bytes committed into two stores, with and without statistics: the same data files."""
    entries: dict[bool, list[dict[str, Any]]] = {}
    for with_stats in (True, False):
        target = make_target("local")
        settings = table_settings(target, tmp_path / str(with_stats))
        async with target.open() as store:
            job = await stage_parquet_job(store, "orders", "job-1", tasks=3, n=5, stats=with_stats)
            assert all((f.stats is not None) is with_stats for w in job.req.winners for f in w.files)
            step = job.step(TableBinding(table="lake.orders", mode="create"))
            assert bool(step.described) is with_stats
            res = await commit_dataset(store, job.req, ManualLease("orders", 1), settings, extra_steps=[step])
            assert res.ok, res
            # Then an overwrite: the job's files replace the first job's, described the same way.
            again = await stage_parquet_job(store, "orders", "job-2", tasks=2, n=4, stats=with_stats)
            step = again.step(TableBinding(table="lake.orders", mode="overwrite"))
            lease = ManualLease("orders", 2)
            res = await commit_dataset(store, again.req, lease, settings, extra_steps=[step])
            assert res.ok, res
            tbl = load_table(open_catalog(settings, store.url), "lake.orders")
            assert tbl is not None
            root = store.url.rstrip("/") + "/"
            found = []
            for snapshot in tbl.metadata.snapshots:
                for manifest in snapshot.manifests(tbl.io):
                    for entry in manifest.fetch_manifest_entry(tbl.io, discard_deleted=False):
                        fields = fields_of(entry.data_file)
                        assert fields["file_path"].startswith(root)
                        fields["file_path"] = fields["file_path"].removeprefix(root)
                        found.append((snapshot.sequence_number, str(entry.status), fields))
            entries[with_stats] = sorted(found, key=lambda e: (e[0], e[1], e[2]["file_path"]))
    assert len({e[2]["file_path"] for e in entries[True]}) == 5
    assert entries[True] == entries[False]
    assert all(e[2]["lower_bounds"] and e[2]["record_count"] in (4, 5) for e in entries[True])


async def test_a_file_unlike_its_report_is_quarantined_before_its_stats_are_used(
    tmp_path: Path, make_target: MakeTarget
) -> None:
    """A staged file whose size or MD5 differs from its report publishes nothing and touches no table."""
    target = make_target("local")
    settings = table_settings(target, tmp_path)
    async with target.open() as store:
        first = await stage_parquet_job(store, "orders", "job-1", stats=True)
        step = first.step(TableBinding(table="lake.orders", mode="create"))
        res = await commit_dataset(store, first.req, ManualLease("orders", 1), settings, extra_steps=[step])
        assert res.ok
        for lie in ("size", "md5"):
            dataset = f"orders_{lie}"
            job = await stage_parquet_job(store, dataset, "job-2", stats=True)
            w = job.req.winners[0]
            f = w.files[0]
            told = (
                msgspec.structs.replace(f, size=f.size + 1)
                if lie == "size"
                else msgspec.structs.replace(f, md5="0" * 32)
            )
            winners = [msgspec.structs.replace(w, files=[told]), *job.req.winners[1:]]
            req = msgspec.structs.replace(job.req, winners=winners)
            bad = table_step(req, TableBinding(table="lake.orders"))
            assert bad.described  # the lying file's stats are in the step
            res = await commit_dataset(store, req, ManualLease(dataset, 1), settings, extra_steps=[bad])
            assert res.status == "quarantined" and res.quarantined is not None, res
            assert job_snapshots(settings, store.url, "lake.orders") == [("orders", "job-1")]
            assert [info.key async for info in store.list(f"{dataset}/") if "~" in info.key] == []
