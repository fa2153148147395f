"""File statistics sent with a staged file give the same Delta add actions as the Parquet footer read.

Each file is written by pyarrow, its statistics taken from the footer as the
Spark writer takes them; the Delta step builds the add action's ``stats`` and
the file's schema from them (no read), or reads the footer. The two must
agree for every column type of the contract Delta has, per file and through
whole commits (a create, an append, an overwrite), and delta-rs must read the
same table and the same statistics either way.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from shared.commit import commit_dataset
from shared.commit._delta_log import (
    add_stats_from_stats,
    delta_schema,
    file_stats,
    schema_from_stats,
)
from shared.events import MAX_BOUND_CHARS
from tests._support.commit import ManualLease, fast_settings
from tests._support.delta import local_root, stage_tables_job
from tests._support.emulators import MakeTarget
from tests._support.fault_store import FaultStore
from tests._support.tables import parquet_with_stats

LONG = "ü" * (MAX_BOUND_CHARS + 9)


def delta_table(rows: int = 40, *, narrow_ints: bool = True, seed: int = 0) -> pa.Table:
    """Every contract type Delta has: nulls, NaN, infinities, strings around 32 and 64 characters.

    ``narrow_ints``: 8- and 16-bit columns too (their statistics say ``int``: the footer tells the width).
    """
    base = dt.datetime(2024, 2, 29, 23, 59, 58, 123456) + dt.timedelta(days=seed)
    columns: dict[str, tuple[pa.DataType, list[Any]]] = {
        "i32": (pa.int32(), [2**31 - 1 - seed, -(2**31), None]),
        "i64": (pa.int64(), [2**63 - 1, -(2**63) + seed, 0]),
        "f32": (pa.float32(), [1.5, -math.inf, None, math.nan]),
        "f64": (pa.float64(), [0.1, math.inf, -2.5e300, math.nan]),
        "dec_small": (pa.decimal128(5, 2), [Decimal("1.20"), Decimal("-3.45"), None]),
        "dec_big": (pa.decimal128(22, 4), [Decimal("12345678901234567.8901"), Decimal("-0.0001")]),
        "s": (pa.string(), ["b", "a" + LONG, None, "ÿ" + LONG, "é"]),
        "s32": (pa.string(), ["x" * 32, "a" * 31 + "é"]),
        "s33": (pa.string(), ["z" * 33, "b"]),
        "s64": (pa.large_string(), ["a" * 64, "z" * 64]),
        "s_short": (pa.string(), ["x", "yy", f"abc{seed}"]),
        "b": (pa.binary(), [b"\x00\xff", b"\xfe" * (MAX_BOUND_CHARS + 3), None]),
        "fx": (pa.binary(4), [b"abcd", b"\x00\x01\x02\x03"]),
        "d": (pa.date32(), [dt.date(1969, 12, 31), dt.date(2038, 1, 19) - dt.timedelta(days=seed), None]),
        "ts_s": (pa.timestamp("s"), [base.replace(microsecond=0)]),
        "ts_ms": (pa.timestamp("ms"), [base.replace(microsecond=123000), None]),
        "ts": (pa.timestamp("us"), [base, dt.datetime(1900, 1, 1)]),
        "tstz": (pa.timestamp("us", tz="UTC"), [base.replace(tzinfo=dt.UTC), None]),
        "bo": (pa.bool_(), [True, None, False]),
        "nothing": (pa.int64(), [None]),
        "a.b": (pa.int64(), [1, 2]),  # a top-level name with a dot: no statistics either way
    }
    if narrow_ints:
        columns |= {
            "i8": (pa.int8(), [-5, None, 7]),
            "i16": (pa.int16(), [300, -300]),
            "u8": (pa.uint8(), [0, 255]),
            "u16": (pa.uint16(), [0, 65535]),
        }
    arrays = {name: pa.array([v[i % len(v)] for i in range(rows)], t) for name, (t, v) in columns.items()}
    fields = [pa.field(name, t) for name, (t, _) in columns.items()]
    fields.append(pa.field("req", pa.int64(), nullable=False))
    arrays["req"] = pa.array(range(seed, seed + rows), pa.int64())
    return pa.table(arrays, schema=pa.schema(fields))


@pytest.mark.parametrize("narrow_ints", [False, True])
@pytest.mark.parametrize("row_group_size", [7, 1000])
def test_a_files_stats_give_the_footers_add_stats_and_schema(narrow_ints: bool, row_group_size: int) -> None:
    table = delta_table(narrow_ints=narrow_ints)
    body, stats = parquet_with_stats(table, row_group_size=row_group_size)
    assert stats is not None
    meta = pq.read_metadata(pa.BufferReader(body))
    assert stats.columns["s"].upper_cut and not stats.columns["s64"].upper_cut
    footer = file_stats(meta)
    assert msgspec.json.encode(add_stats_from_stats(stats)) == msgspec.json.encode(footer)
    # Not a vacuous equality: bounds of ints, dates, strings, timestamps, decimals, booleans, null counts.
    assert {"i32", "i64", "d", "s", "s32", "s64", "s_short", "req", "ts", "tstz", "dec_big", "bo"} <= set(
        footer["minValues"]
    )
    assert {"i32", "d", "s32", "s_short", "ts_s", "ts_ms", "ts", "tstz", "dec_small", "dec_big", "bo"} <= set(
        footer["maxValues"]
    )
    # None for floats (Parquet's bounds leave NaN out), binaries, a dotted name.
    assert not {"f32", "f64", "b", "fx", "a.b"} & (set(footer["minValues"]) | set(footer["maxValues"]))
    encoded = msgspec.json.encode({k: footer[k] for k in ("minValues", "maxValues")}).decode()
    # Timestamps in milliseconds, the minimum cut down and the maximum rounded up; Z for a time zone.
    assert '"ts":"1900-01-01T00:00:00.000"' in encoded and '"ts":"2024-02-29T23:59:58.124"' in encoded
    assert '"tstz":"2024-02-29T23:59:58.123Z"' in encoded and '"tstz":"2024-02-29T23:59:58.124Z"' in encoded
    assert '"ts_ms":"2024-02-29T23:59:58.123"' in encoded  # exact milliseconds stay as they are
    # Decimals as exact JSON numbers of their scale (delta-rs writes a float: 1.2345678901234568e+16).
    assert '"dec_big":-0.0001' in encoded and '"dec_big":12345678901234567.8901' in encoded
    assert '"dec_small":-3.45' in encoded and '"dec_small":1.20' in encoded
    assert (footer["minValues"]["bo"], footer["maxValues"]["bo"]) == (False, True)
    # Longer maxima: their first 32 characters and a tie-breaker above the character cut off.
    assert footer["maxValues"]["s"] == "ÿ" + "ü" * 31 + "\U0010ffff"
    assert footer["maxValues"]["s33"] == "z" * 32 + "\x7f"
    assert footer["maxValues"]["s64"] == "z" * 32 + "\x7f"
    assert footer["nullCount"]["s"] == 8 and footer["nullCount"]["nothing"] == 40
    schema, ntz = delta_schema(meta.schema.to_arrow_schema())
    assert ntz
    if narrow_ints:  # byte and short: only the footer tells them from integer
        assert schema_from_stats(stats) is None
        assert schema_from_stats(stats, table=schema) is None
    else:
        assert schema_from_stats(stats) is None  # an int column, no table to say it is Delta's integer
        assert schema_from_stats(stats, table=schema) == (schema, True)
        no_int = table.drop_columns(["i32"])
        body, stats = parquet_with_stats(no_int)
        assert stats is not None
        meta = pq.read_metadata(pa.BufferReader(body))
        assert schema_from_stats(stats, ["day"]) == delta_schema(meta.schema.to_arrow_schema(), ["day"])


def _log_actions(root: Path, dataset: str) -> list[list[dict[str, Any]]]:
    """Every version's actions, without what differs between two runs (times, the table id)."""
    out = []
    for path in sorted((root / dataset / "_delta_log").glob("*.json")):
        actions = []
        for line in path.read_bytes().splitlines():
            action = msgspec.json.decode(line)
            for kind, drop in (
                ("commitInfo", ("timestamp",)),
                ("add", ("modificationTime",)),
                ("remove", ("deletionTimestamp",)),
                ("metaData", ("id", "createdTime")),
                ("txn", ("lastUpdated",)),
            ):
                for field in drop:
                    action.get(kind, {}).pop(field, None)
            actions.append(action)
        out.append(actions)
    return out


def _add_actions(root: Path, dataset: str) -> list[dict[str, Any]]:
    """delta-rs' flattened add actions of the current snapshot (statistics columns included), by path."""
    found = pa.table(DeltaTable(str(root / dataset)).get_add_actions(flatten=True))
    rows = found.drop_columns(["modification_time"]).to_pylist()
    return sorted(rows, key=lambda r: str(r["path"]))


@pytest.mark.parametrize("ints", ["narrow", "int32", "none"])
async def test_commits_with_stats_land_the_same_log_as_commits_without(
    make_target: MakeTarget, ints: str
) -> None:
    """The same staged bytes committed into two stores, with and without statistics: the same versions."""
    logs: dict[bool, list[list[dict[str, Any]]]] = {}
    adds: dict[bool, list[dict[str, Any]]] = {}
    reads: dict[bool, list[str]] = {}
    for with_stats in (True, False):
        target = make_target("local")
        async with target.open() as inner:
            store = FaultStore(inner)
            plan = [
                ("job-1", 3, "append"),
                ("job-2", 2, "append"),
                ("job-3", 2, "overwrite"),
                ("job-4", 1, "append"),
            ]
            for n, (job, tasks, mode) in enumerate(plan):
                tables = [delta_table(narrow_ints=ints == "narrow", seed=n * 10 + t) for t in range(tasks)]
                if ints == "none":
                    tables = [t.drop_columns(["i32"]) for t in tables]
                staged = await stage_tables_job(
                    store,
                    "sales",
                    job,
                    tables,
                    stats=with_stats,
                    row_group_size=7,  # type: ignore[arg-type]
                )
                res = await commit_dataset(
                    store,  # type: ignore[arg-type]
                    staged.req,
                    ManualLease("sales", n + 1),
                    fast_settings(),
                    extra_steps=[staged.step(mode)],
                )
                assert res.ok, res
            root = local_root(inner)
            assert root is not None
            logs[with_stats] = _log_actions(root, "sales")
            adds[with_stats] = _add_actions(root, "sales")
            reads[with_stats] = [k for op, k in store.ops if op == "read" and k.endswith(".parquet")]
            rows = pa.table(DeltaTable(str(root / "sales")).to_pyarrow_table())
            assert rows.num_rows == 3 * 40 and sorted(rows["req"].to_pylist())[:2] == [20, 21]
    assert len(logs[True]) == 4
    assert logs[True] == logs[False]
    assert adds[True] == adds[False]
    assert len(adds[True]) == 3 and {"min.s_short", "max.d", "null_count.s"} <= set(adds[True][0])
    assert len(reads[False]) == 8  # every file's footer
    # narrow: the first file's footer for the schema, then byte/short columns: every footer; int32: the first
    # file's footer for the schema only (an int column: Delta's integer or narrower); none: no footer at all.
    assert len(reads[True]) == {"narrow": 8, "int32": 1, "none": 0}[ints]


async def test_narrower_integer_files_go_into_an_integer_column_from_stats_and_delta_rs_reads_them(
    make_target: MakeTarget,
) -> None:
    """The one place the two ways differ: statistics say ``int`` for 8-, 16- and 32-bit columns alike.

    Against a table column of Delta's ``integer`` such a file is taken (all of them are Parquet INT32,
    which delta-rs reads as ``integer``, bounds included); its footer would say ``byte``/``short`` and
    the footer's check refuses it.
    """
    target = make_target("local")
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        cases = [
            (pa.int32(), True),
            (pa.int16(), True),
            (pa.int8(), True),
            (pa.uint16(), True),
            (pa.int16(), False),
        ]
        got = []
        for i, (t, with_stats) in enumerate(cases):
            staged = await stage_tables_job(
                store, "sales", f"job-{i}", [pa.table({"n": pa.array([i, 100 + i], t)})], stats=with_stats
            )
            res = await commit_dataset(
                store, staged.req, ManualLease("sales", i + 1), fast_settings(), extra_steps=[staged.step()]
            )
            got.append(res.status)
        assert got == ["committed"] * 4 + ["quarantined"]
        dt = DeltaTable(str(root / "sales"))
        assert [(f.name, str(f.type)) for f in dt.schema().fields] == [("n", 'PrimitiveType("integer")')]
        assert sorted(pa.table(dt.to_pyarrow_table())["n"].to_pylist()) == [0, 1, 2, 3, 100, 101, 102, 103]
        found = pa.table(dt.get_add_actions(flatten=True))
        assert sorted(zip(found["min.n"].to_pylist(), found["max.n"].to_pylist(), strict=True)) == [
            (i, 100 + i) for i in range(4)
        ]


def test_a_row_group_without_bounds_leaves_the_column_without_bounds() -> None:
    """pyarrow writes no min/max for a value over its statistics limit: the other groups' are not bounds."""
    table = pa.table({"s": ["a" * 5000, "b", "c", "d"], "n": pa.array([4, 3, 2, 1], pa.int64())})
    body, stats = parquet_with_stats(table, row_group_size=2)
    assert stats is not None
    meta = pq.read_metadata(pa.BufferReader(body))
    assert not meta.row_group(0).column(0).statistics.has_min_max
    s = stats.columns["s"]
    assert (s.lower, s.upper, s.nulls) == (None, None, 0)
    assert (stats.columns["n"].lower, stats.columns["n"].upper) == (1, 4)
    assert add_stats_from_stats(stats) == file_stats(meta)
    assert file_stats(meta)["minValues"] == {"n": 1}


def test_a_string_max_is_an_upper_bound_as_delta_kernel_writes_it() -> None:
    from shared.commit._delta_log import string_max

    top = "\U0010ffff"
    assert string_max("abc", False) == "abc"
    assert string_max("a" * 32, False) == "a" * 32
    assert string_max("a" * 33, False) == "a" * 32 + "\x7f"
    assert string_max("a" * 32 + "\x7f", False) == "a" * 32 + top
    assert string_max("a" * 32 + "é", False) == "a" * 32 + top
    assert string_max("a" * 32 + top + "b", False) == "a" * 32 + top + "\x7f"
    assert string_max("a" * 32 + top * 32, True) is None  # what follows is unknown
    assert string_max("a" * 32 + top * 2, False) == "a" * 32 + top * 2  # the whole value
    for value in ("a" * 33, "a" * 32 + "~" * 9, "a" * 32 + "é", "a" * 32 + top + "b", "é" * 70):
        bound = string_max(value[:MAX_BOUND_CHARS], len(value) > MAX_BOUND_CHARS)
        assert bound is not None and bound >= value and value.startswith(bound[:32])


async def test_delta_rs_finds_a_row_by_a_long_string_with_the_statistics_in_force(
    make_target: MakeTarget,
) -> None:
    """A filter on a long string keeps the file whose cut maximum it is near (not skipped), skips others."""
    import pyarrow.dataset as pads

    target = make_target("local")
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        values = ["k" * 40 + "~", "k" * 40 + "é", "m" * 70]
        for i, v in enumerate(values):
            staged = await stage_tables_job(
                store, "sales", f"job-{i}", [pa.table({"s": [v, "a"]})], stats=True
            )
            res = await commit_dataset(
                store, staged.req, ManualLease("sales", i + 1), fast_settings(), extra_steps=[staged.step()]
            )
            assert res.ok, res
        dt = DeltaTable(str(root / "sales"))
        assert sorted(pa.table(dt.get_add_actions(flatten=True))["max.s"].to_pylist()) == [
            "k" * 32 + "\x7f",
            "k" * 32 + "\x7f",
            "m" * 32 + "\x7f",
        ]
        for v in values:
            found = dt.to_pyarrow_dataset().to_table(filter=pads.field("s") == v)
            assert found["s"].to_pylist() == [v]
        assert dt.to_pyarrow_dataset().to_table(filter=pads.field("s") > "l").num_rows == 1


def _skipping_table(i: int) -> pa.Table:
    """File ``i`` of the skipping test: each column's values in a range of its own (file 2: the extremes)."""
    base = dt.datetime(2024, 1 + i, 1, 0, 0, 0, 999)  # sub-millisecond: Delta keeps milliseconds
    ts = [base, base + dt.timedelta(days=1)]
    dec38 = [Decimal(f"{i}.000001"), Decimal(f"{i}9999999999999999999999999999999.999999")]
    if i == 2:
        ts = [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)]  # a maximum beyond ms
        dec38 = [Decimal("-99999999999999999999999999999999.999999"), Decimal("0.000001")]
    return pa.table(
        {
            "id": pa.array([f"r{i}a", f"r{i}b"]),
            "ts": pa.array(ts, pa.timestamp("us")),
            "tstz": pa.array([t.replace(tzinfo=dt.UTC) for t in ts], pa.timestamp("us", tz="UTC")),
            "d": pa.array([dt.date(2020 + i, 1, 1), dt.date(2020 + i, 6, 1)]),
            "dec": pa.array([Decimal(f"{i}.05"), Decimal(f"{i}.95")], pa.decimal128(10, 2)),
            "dec38": pa.array(dec38, pa.decimal128(38, 6)),
            "bo": pa.array([i % 2 == 0, i % 2 == 0]),
            "s": pa.array(['"quoted"\n\\', "\u2028😀" + "\x00"]) if i == 1 else pa.array(["a", "b"]),
            "nothing": pa.array([None, None], pa.int64()),
        }
    )


def _query(table: Path, where: str) -> list[str]:
    """The ids DataFusion (delta-rs' query engine: it skips files by their add actions' statistics) finds."""
    from deltalake import QueryBuilder

    found = QueryBuilder().register("t", DeltaTable(str(table))).execute(f"select id from t where {where}")
    return sorted(pa.table(found.read_all())["id"].to_pylist())


@pytest.mark.parametrize("with_stats", [True, False])
async def test_delta_rs_skips_files_by_the_fleets_timestamp_date_decimal_bounds_and_keeps_every_match(
    make_target: MakeTarget, with_stats: bool
) -> None:
    """Three files, each committed with its producer's statistics or from its footer. delta-rs reads the
    bounds (milliseconds, the maximum rounded up; exact decimals; booleans; none for a column of nulls or a
    maximum beyond year 9999), skips the file they exclude (it is moved away: a read of it would fail) and
    finds every row a predicate matches, down to a maximum's microseconds."""
    target = make_target("local")
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        for i in range(3):
            staged = await stage_tables_job(
                store, "sales", f"job-{i}", [_skipping_table(i)], stats=with_stats
            )
            res = await commit_dataset(
                store, staged.req, ManualLease("sales", i + 1), fast_settings(), extra_steps=[staged.step()]
            )
            assert res.ok, res
        table = root / "sales"
        adds = {
            str(a["path"]).split("~")[0]: a
            for a in pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).to_pylist()
        }
        assert (adds["job-0"]["min.ts"], adds["job-0"]["max.ts"]) == (
            dt.datetime(2024, 1, 1),
            dt.datetime(2024, 1, 2, 0, 0, 0, 1000),
        )
        assert adds["job-0"]["max.tstz"] == dt.datetime(2024, 1, 2, 0, 0, 0, 1000, tzinfo=dt.UTC)
        assert (adds["job-2"]["min.ts"], adds["job-2"]["max.ts"]) == (dt.datetime(1, 1, 1), None)
        assert (adds["job-1"]["min.dec"], adds["job-1"]["max.dec"]) == (Decimal("1.05"), Decimal("1.95"))
        assert (adds["job-2"]["min.dec38"], adds["job-1"]["max.dec38"]) == (
            Decimal("-99999999999999999999999999999999.999999"),
            Decimal("19999999999999999999999999999999.999999"),
        )
        assert [(adds[f"job-{i}"]["min.bo"], adds[f"job-{i}"]["max.bo"]) for i in range(3)] == [
            (True, True),
            (False, False),
            (True, True),
        ]
        assert (adds["job-1"]["min.s"], adds["job-1"]["max.s"]) == ('"quoted"\n\\', "\u2028😀\x00")
        for a in adds.values():  # a column of nulls only: its null count, no bounds
            assert (a["null_count.nothing"], a["min.nothing"], a["max.nothing"]) == (2, None, None)
        # Every match found, including a maximum's microseconds (the bound is rounded up to milliseconds).
        assert _query(table, "ts = '2024-01-02 00:00:00.000999'") == ["r0b"]
        assert _query(table, "tstz = '2024-01-02T00:00:00.000999Z'") == ["r0b"]
        assert _query(table, "ts > '2024-12-31 00:00:00'") == ["r2b"]
        assert _query(table, "dec38 = CAST('19999999999999999999999999999999.999999' AS DECIMAL(38, 6))") == [
            "r1b"
        ]
        assert _query(table, "bo") == ["r0a", "r0b", "r2a", "r2b"]
        assert _query(table, "nothing is not null") == []
        # The file the bounds exclude is skipped: moved away, the reads that exclude it still succeed.
        job0 = next(p for p in table.iterdir() if p.name.startswith("job-0~"))
        away = job0.rename(root / "away.parquet")
        try:
            assert _query(table, "ts >= '2024-02-01 00:00:00'") == ["r1a", "r1b", "r2b"]
            assert _query(table, "tstz >= '2024-02-01T00:00:00Z'") == ["r1a", "r1b", "r2b"]
            assert _query(table, "d >= '2021-01-01'") == ["r1a", "r1b", "r2a", "r2b"]
            assert _query(table, "dec >= 1.00") == ["r1a", "r1b", "r2a", "r2b"]
            # job-0's maximum is 31 nines and 6 decimals: exact, just under 10^31.
            assert _query(table, "dec38 >= CAST('10000000000000000000000000000000' AS DECIMAL(38, 6))") == [
                "r1b"
            ]
        finally:
            away.rename(job0)


async def test_a_float_column_gets_no_bounds_and_delta_rs_reads_it(make_target: MakeTarget) -> None:
    """Parquet's float bounds leave NaN out, and Spark and DataFusion order NaN above every number: a
    Delta bound made from them could make a reader skip a file whose NaN matches ``f > bound``. The
    fleet writes none (null counts only); delta-rs reads the table and filters it right on the numbers.
    (DataFusion still misses the NaN row for ``f > 1.6`` through the Parquet file's own row-group
    bounds, with or without Delta bounds: that part is the reader's.)"""
    target = make_target("local")
    async with target.open() as store:
        root = local_root(store)
        assert root is not None
        tables = [pa.table({"id": ["a", "n"], "f": pa.array([1.5, math.nan], pa.float32())})]
        tables.append(pa.table({"id": ["b", "c"], "f": pa.array([5.0, -math.inf], pa.float32())}))
        for i, t in enumerate(tables):
            staged = await stage_tables_job(store, "sales", f"job-{i}", [t], stats=True)
            res = await commit_dataset(
                store, staged.req, ManualLease("sales", i + 1), fast_settings(), extra_steps=[staged.step()]
            )
            assert res.ok, res
        table = root / "sales"
        found = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True))
        assert found["min.f"].to_pylist() == found["max.f"].to_pylist() == [None, None]
        assert found["null_count.f"].to_pylist() == [0, 0]
        assert _query(table, "f > 1.6") == ["b"]
        assert _query(table, "f < 0") == ["c"]
        assert _query(table, "isnan(f)") == ["n"]
