"""A staged file's statistics in the contract: bounds of every type round-trip, malformed ones are refused.

A malformed ``stats`` object dead-letters its ``task_finished`` with ``schema`` (another version of it with
``unsupported_version``), the detail naming the field; a message without ``stats`` is as it was.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from decimal import Decimal
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared.events import (
    MAX_BOUND_CHARS,
    MAX_STATS_COLUMNS,
    ColumnStats,
    FileStats,
    InvalidMessage,
    StagedFile,
    TaskFinished,
    ValidationLimits,
    decode_bound,
    decode_event,
    encode_bound,
    encode_event,
)
from shared.spark import parquet_file_stats

GOOD = FileStats(
    rows=3,
    offsets=[4, 200],
    columns={
        "id": ColumnStats(type="string", values=3, nulls=0, size=80, lower="a", upper="c"),
        "amount": ColumnStats(type="decimal(9,2)", values=3, size=50, lower="-1.50", upper="2.00"),
    },
)


def event(stats: Any, size: int = 1000) -> bytes:
    """A task_finished whose one file carries ``stats`` (a FileStats, or raw JSON-able data)."""
    ev = TaskFinished(
        job="j1",
        dataset="d1",
        task=0,
        attempt=0,
        files=[StagedFile(path="p.parquet", size=size)],
        finished_at=1.0,
    )
    raw = msgspec.json.decode(encode_event(ev))
    raw["files"][0]["stats"] = msgspec.to_builtins(stats)
    return msgspec.json.encode(raw)


def rejected(data: bytes) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as err:
        decode_event(data, sig=None, limits=ValidationLimits())
    return err.value


@pytest.mark.parametrize(
    ("type_name", "value"),
    [
        ("boolean", False),
        ("int", -(2**31)),
        ("long", 2**63 - 1),
        ("float", 1.5),
        ("double", -math.inf),
        ("double", 5e-324),
        ("decimal(9,2)", Decimal("-0.05")),
        ("decimal(38,10)", Decimal("0E-10")),
        ("decimal(5,0)", Decimal("12345")),
        ("decimal(38,6)", Decimal("-" + "9" * 32 + ".999999")),  # over the default context's 28 digits
        ("date", dt.date(1, 1, 1)),
        ("time", dt.time(23, 59, 59, 999999)),
        ("timestamp", dt.datetime(1969, 12, 31, 23, 59, 59, 1)),
        ("timestamptz", dt.datetime(2024, 6, 1, 8, 30, tzinfo=dt.UTC)),
        ("string", "é\u2603\U0001f600"),
        ("binary", b"\x00\xff"),
        ("fixed[3]", b"abc"),
    ],
)
def test_every_type_round_trips_through_json(type_name: str, value: Any) -> None:
    sent = msgspec.json.decode(msgspec.json.encode(encode_bound(type_name, value)))
    assert decode_bound(type_name, sent) == value
    stats = FileStats(
        rows=1,
        offsets=[4],
        columns={"c": ColumnStats(type=type_name, values=1, size=1, lower=sent, upper=sent)},
    )
    back = decode_event(event(stats), sig=None, limits=ValidationLimits())
    assert isinstance(back, TaskFinished) and back.files[0].stats == stats


def test_nan_is_a_float_bound_and_orders_with_nothing() -> None:
    assert math.isnan(decode_bound("float", "NaN"))
    stats = FileStats(
        rows=1,
        offsets=[4],
        columns={"f": ColumnStats(type="double", values=1, size=1, lower="NaN", upper=1.0)},
    )
    decode_event(event(stats), sig=None, limits=ValidationLimits())


def test_a_file_without_stats_encodes_as_before() -> None:
    ev = TaskFinished(
        job="j", dataset="d", task=0, attempt=0, files=[StagedFile(path="p", size=1)], finished_at=1
    )
    assert b"stats" not in encode_event(ev)


def _column(**changes: Any) -> dict[str, Any]:
    col: dict[str, Any] = {"type": "long", "values": 3, "nulls": 1, "size": 10, "lower": 1, "upper": 2}
    col.update(changes)
    return {"v": 1, "rows": 3, "offsets": [4], "columns": {"c": col}}


@pytest.mark.parametrize(
    ("stats", "reason", "where"),
    [
        ({**_column(), "v": 2}, "unsupported_version", "$.files[0].stats.v"),
        (_column(type="uint64"), "schema", "$.files[0].stats.columns['c'].type"),
        (_column(type="decimal(39,2)"), "schema", "$.files[0].stats.columns['c'].type"),
        (_column(lower="1"), "schema", "$.files[0].stats.columns['c'].lower"),
        (_column(type="int", upper=2**31), "schema", "$.files[0].stats.columns['c'].upper"),
        (_column(lower=5, upper=2), "schema", "$.files[0].stats.columns['c']"),
        (_column(nulls=4), "schema", "$.files[0].stats.columns['c'].nulls"),
        (_column(lower_cut=True), "schema", "$.files[0].stats.columns['c'].lower_cut"),
        (_column(type="string", lower="a", upper="b", upper_cut=True), "schema", "columns['c'].upper"),
        (
            _column(type="string", lower="a" * (MAX_BOUND_CHARS + 1), upper="b"),
            "schema",
            "columns['c'].lower",
        ),
        (_column(type="string", lower=None, upper=None, lower_cut=True), "schema", "lower_cut"),
        (_column(type="binary", lower="not base64!", upper=None), "schema", "columns['c'].lower"),
        (_column(type="fixed[2]", lower="AAAA", upper=None), "schema", "columns['c'].lower"),
        (_column(type="decimal(9,2)", lower="1.5", upper=None), "schema", "columns['c'].lower"),
        (_column(type="decimal(9,2)", lower="1e2", upper=None), "schema", "columns['c'].lower"),
        (_column(type="date", lower="2024-6-1", upper=None), "schema", "columns['c'].lower"),
        (_column(type="timestamp", lower="2024-06-01T00:00:00+00:00", upper=None), "schema", "lower"),
        (_column(type="timestamptz", lower="2024-06-01T00:00:00", upper=None), "schema", "lower"),
        (_column(type="double", lower="nan", upper=None), "schema", "columns['c'].lower"),
        (_column(type="boolean", lower=1, upper=None), "schema", "columns['c'].lower"),
        ({**_column(), "offsets": [8, 8]}, "schema", "$.files[0].stats.offsets[1]"),
        ({**_column(), "offsets": [200_000]}, "schema", "$.files[0].stats.offsets[0]"),
        ({**_column(), "extra": 1}, "schema", "extra"),
        ({**_column(), "rows": -1}, "schema", "rows"),
        (
            {
                **_column(),
                "columns": {f"c{i}": _column()["columns"]["c"] for i in range(MAX_STATS_COLUMNS + 1)},
            },
            "schema",
            "$.files[0].stats.columns",
        ),
        ({**_column(), "offsets": list(range(1, 4098))}, "schema", "offsets"),
    ],
)
def test_malformed_stats_dead_letter_the_event(stats: dict[str, Any], reason: str, where: str) -> None:
    err = rejected(event(stats, size=100_000))
    assert (err.reason, where in err.detail) == (reason, True), err.detail


def test_the_writer_sums_row_groups_and_leaves_out_what_a_row_group_lacks() -> None:
    table = pa.table({"a": pa.array(range(10), pa.int64()), "b": pa.array([None, "x"] * 5)})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=3, write_statistics=["a"])
    stats = parquet_file_stats(pq.read_metadata(pa.BufferReader(buf.getvalue())))
    assert stats is not None
    assert (stats.rows, len(stats.offsets)) == (10, 4)
    a, b = stats.columns["a"], stats.columns["b"]
    assert (a.values, a.nulls, a.lower, a.upper) == (10, 0, 0, 9)
    assert (b.values, b.nulls, b.lower, b.upper) == (10, None, None, None)  # no statistics written for b
    assert decode_event(event(stats, size=len(buf.getvalue())), sig=None, limits=ValidationLimits())


def test_the_writer_leaves_the_stats_out_of_an_event_they_would_make_too_big() -> None:
    from shared.spark._writer import STATS_EVENT_BUDGET, task_finished

    one = FileStats(
        rows=1,
        offsets=[4],
        columns={
            f"column_{i}": ColumnStats(type="string", values=1, size=9, lower="a" * 60) for i in range(200)
        },
    )
    few = [StagedFile(path=f"k={i}/part-0.parquet", size=1000, stats=one) for i in range(2)]
    small = task_finished("j", "d", 0, 0, few, {}, 1.0)
    assert all(f.stats == one for f in small.files)
    many = [StagedFile(path=f"k={i}/part-0.parquet", size=1000, stats=one) for i in range(40)]
    assert len(
        encode_event(TaskFinished(job="j", dataset="d", task=0, attempt=0, files=many, finished_at=1.0))
    ) > (STATS_EVENT_BUDGET)
    big = task_finished("j", "d", 0, 0, many, {"w": 1}, 1.0)
    assert [f.path for f in big.files] == [f.path for f in many] and all(f.stats is None for f in big.files)
    assert big.watermarks == {"w": 1} and len(encode_event(big)) < STATS_EVENT_BUDGET
