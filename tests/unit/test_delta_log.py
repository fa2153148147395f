"""The Delta log's pure part: schema conversion (checked against delta-rs), footer statistics, replay."""

from __future__ import annotations

import datetime
import decimal
import io
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import Schema

from shared.commit import CommitStepFailed
from shared.commit._delta_log import (
    AddFile,
    DeltaState,
    NewTable,
    app_id,
    checkpoint_body,
    commit_body,
    decimal_bound,
    decode_path,
    delta_schema,
    encode_path,
    file_stats,
    partition_values,
    read_listing,
    schema_mismatch,
    timestamp_bound,
)

_TYPES: list[tuple[str, pa.DataType]] = [
    ("s", pa.string()),
    ("ls", pa.large_string()),
    ("b", pa.binary()),
    ("flag", pa.bool_()),
    ("i8", pa.int8()),
    ("i16", pa.int16()),
    ("i32", pa.int32()),
    ("i64", pa.int64()),
    ("f32", pa.float32()),
    ("f64", pa.float64()),
    ("day", pa.date32()),
    ("dec", pa.decimal128(12, 3)),
    ("ts", pa.timestamp("us", tz="UTC")),
    ("ntz", pa.timestamp("us")),
    ("st", pa.struct([("a", pa.int64()), ("b", pa.string())])),
    ("li", pa.list_(pa.int32())),
    ("m", pa.map_(pa.string(), pa.float64())),
]


def _without_metadata(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_metadata(v) for k, v in node.items() if k != "metadata"}
    if isinstance(node, list):
        return [_without_metadata(v) for v in node]
    return node


@pytest.mark.parametrize(("name", "dtype"), _TYPES, ids=[n for n, _ in _TYPES])
def test_the_schema_conversion_agrees_with_delta_rs(name: str, dtype: pa.DataType) -> None:
    schema = pa.schema([pa.field(name, dtype, nullable=name != "i64")])
    ours, ntz = delta_schema(schema)
    theirs = msgspec.json.decode(Schema.from_arrow(schema).to_json())
    assert _without_metadata(ours) == _without_metadata(theirs)
    assert ntz == (name == "ntz")


def test_types_without_a_delta_equal_are_refused() -> None:
    with pytest.raises(CommitStepFailed, match="u64"):
        delta_schema(pa.schema([("u64", pa.uint64())]))


def test_partition_columns_the_files_lack_are_added_as_strings() -> None:
    schema, _ = delta_schema(pa.schema([("id", pa.string())]), ["day"])
    assert [(f["name"], f["type"]) for f in schema["fields"]] == [("id", "string"), ("day", "string")]


def _footer(t: pa.Table, row_group_size: int) -> Any:
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=row_group_size)
    return pq.read_metadata(io.BytesIO(buf.getvalue()))


def test_file_stats_from_the_footer_span_every_row_group() -> None:
    long = "x" * 40
    t = pa.table(
        {
            "n": pa.array([5, None, -3, 9], pa.int64()),
            "f": pa.array([1.5, 2.5, float("nan"), 0.5], pa.float64()),
            "s": pa.array(["b", "a", long, "c"], pa.string()),
            "d": pa.array([datetime.date(2024, 1, 2), None, None, datetime.date(2023, 5, 1)], pa.date32()),
            "ts": pa.array([datetime.datetime(2024, 1, 1)] * 4, pa.timestamp("us")),
            "flag": pa.array([True, False, True, True]),
            "dec": pa.array([decimal.Decimal("1.000")] * 4, pa.decimal128(6, 3)),
            "st": pa.array([{"a": 1}] * 4, pa.struct([("a", pa.int64())])),
        }
    )
    stats = file_stats(_footer(t, row_group_size=2))
    assert stats["numRecords"] == 4
    assert stats["minValues"]["n"] == -3 and stats["maxValues"]["n"] == 9
    assert stats["minValues"]["s"] == "a"
    # The maximum is over 32 characters: its first 32 and a tie-breaker above the 33rd, an upper bound.
    assert stats["maxValues"]["s"] == "x" * 32 + "\x7f"
    assert stats["minValues"]["d"] == "2023-05-01" and stats["maxValues"]["d"] == "2024-01-02"
    assert stats["nullCount"]["n"] == 1 and stats["nullCount"]["d"] == 2
    assert (stats["minValues"]["ts"], stats["maxValues"]["ts"]) == ("2024-01-01T00:00:00.000",) * 2
    assert (stats["minValues"]["flag"], stats["maxValues"]["flag"]) == (False, True)
    dec = msgspec.json.encode([stats["minValues"]["dec"], stats["maxValues"]["dec"]])
    assert dec == b"[1.000,1.000]"  # exact, at the column's scale
    for col in ("f", "st", "st.a"):  # floats (NaN), nested
        assert col not in stats["minValues"] and col not in stats["maxValues"]
    assert stats["nullCount"]["f"] == 0


@pytest.mark.parametrize(
    ("value", "unit", "tz", "upper", "text"),
    [
        (1_500, "us", False, False, "1970-01-01T00:00:00.001"),
        (1_500, "us", False, True, "1970-01-01T00:00:00.002"),
        (-1_500, "us", True, False, "1969-12-31T23:59:59.998Z"),
        (-1_500, "us", True, True, "1969-12-31T23:59:59.999Z"),
        (1_000_001, "ns", False, True, "1970-01-01T00:00:00.002"),
        (7, "s", True, True, "1970-01-01T00:00:07.000Z"),
        (5, "ms", False, True, "1970-01-01T00:00:00.005"),
        (-62135596800000000, "us", False, False, "0001-01-01T00:00:00.000"),
        (-62135596800000001, "us", False, False, None),  # before year 1
        (253402300799999999, "us", False, True, None),  # 9999-12-31T23:59:59.999999: rounded up, past 9999
        (253402300799999000, "us", True, True, "9999-12-31T23:59:59.999Z"),
    ],
)
def test_timestamp_bounds_are_milliseconds_a_maximum_rounded_up(
    value: int, unit: str, tz: bool, upper: bool, text: str | None
) -> None:
    assert timestamp_bound(value, unit, tz, upper) == text


def test_decimal_bounds_are_exact_json_numbers_of_their_scale() -> None:
    cases = [
        (decimal.Decimal("-0.0000001"), 7, b"-0.0000001"),  # str() would give -1E-7
        (decimal.Decimal("0"), 8, b"0.00000000"),
        (decimal.Decimal("12"), 0, b"12"),
        (decimal.Decimal("9" * 32 + ".999999"), 6, ("9" * 32 + ".999999").encode()),  # over 28 digits
    ]
    for value, scale, raw in cases:
        assert msgspec.json.encode(decimal_bound(value, scale)) == raw


def test_partition_values_from_hive_folders() -> None:
    assert partition_values("day=2024-01-01/hour=07/job~00000-a.parquet") == {
        "day": "2024-01-01",
        "hour": "07",
    }
    assert partition_values("k=a%3Ab/x.parquet") == {"k": "a:b"}
    assert partition_values("k=__HIVE_DEFAULT_PARTITION__/x.parquet") == {"k": None}
    assert partition_values("x.parquet") == {}
    assert partition_values("plain/x.parquet") == {}


def test_paths_are_uri_encoded_and_decode_back() -> None:
    rel = "k=a%3Ab/job-1~00000-my file.parquet"
    assert encode_path(rel) == "k=a%253Ab/job-1~00000-my%20file.parquet"
    assert decode_path(encode_path(rel)) == rel


def test_the_newest_complete_checkpoint_is_chosen() -> None:
    names = [
        *(f"{v:020d}.json" for v in range(13)),
        f"{5:020d}.checkpoint.parquet",
        f"{10:020d}.checkpoint.0000000001.0000000002.parquet",
        f"{10:020d}.checkpoint.0000000002.0000000002.parquet",
        f"{12:020d}.checkpoint.0000000001.0000000002.parquet",  # a part missing: not usable
        "_last_checkpoint",
        f"{3:020d}.crc",
    ]
    got = read_listing(names)
    assert got.commits == list(range(13))
    assert got.checkpoint == 10 and len(got.checkpoint_parts) == 2


def _body(version: int, *, mode: str = "append", removes: list[dict[str, Any]] | None = None) -> bytes:
    new = (
        NewTable(schema={"type": "struct", "fields": []}, partition_columns=[], ntz=False)
        if version == 0
        else None
    )
    return commit_body(
        dataset="sales",
        job=f"job-{version}",
        version=version,
        txn_version=100 + version,  # the job's sequence, not the table version
        mode=mode,
        adds=[AddFile(rel=f"job-{version}~00000-a.parquet", size=10, partition={}, stats={"numRecords": 1})],
        removes=removes or [],
        new_table=new,
        now_ms=1,
    )


def test_replay_of_fleet_commits_tracks_files_txns_and_jobs() -> None:
    state = DeltaState()
    state.apply(0, _body(0), "v0")
    state.apply(1, _body(1), "v1")
    state.apply(2, _body(2, mode="overwrite", removes=list(state.files.values())), "v2")
    assert state.version == 2
    assert list(state.files) == ["job-2~00000-a.parquet"]
    assert state.txns == {app_id("sales"): 102}
    assert state.txn_at == {app_id("sales"): 2}  # the table version whose commit set it
    assert state.fleet_commits == {0: ("sales", "job-0"), 1: ("sales", "job-1"), 2: ("sales", "job-2")}
    assert state.protocol == {"minReaderVersion": 1, "minWriterVersion": 2}
    state.check_writable("overwrite")


def test_a_checkpoint_replays_to_the_same_state() -> None:
    state = DeltaState()
    state.apply(0, _body(0), "v0")
    state.apply(1, _body(1), "v1")
    data, actions = checkpoint_body(state)
    assert actions == 1 + 1 + 1 + 2  # protocol, metaData, one txn, two files
    again = DeltaState()
    again.apply_checkpoint(1, [data], "cp")
    assert (again.version, again.txns) == (1, state.txns)
    assert (again.txn_at, again.checkpoint) == ({}, 1)  # a checkpoint keeps no table version of a txn
    assert again.protocol is not None
    assert {k: v for k, v in again.protocol.items() if v is not None} == state.protocol
    assert again.metadata is not None and state.metadata is not None
    assert again.metadata["schemaString"] == state.metadata["schemaString"]
    assert {p: (a["size"], a["stats"]) for p, a in again.files.items()} == {
        p: (a["size"], a["stats"]) for p, a in state.files.items()
    }


def test_a_commit_that_is_not_json_lines_of_actions_is_unreadable() -> None:
    with pytest.raises(CommitStepFailed, match="line 2 is not JSON"):
        DeltaState().apply(0, b'{"commitInfo": {}}\nnot json\n', "v0")
    with pytest.raises(CommitStepFailed, match="line 1 is a malformed action"):
        DeltaState().apply(0, b'{"add": {"size": 1}}\n', "v0")


@pytest.mark.parametrize(
    ("protocol", "config", "mode", "refused"),
    [
        ({"minReaderVersion": 1, "minWriterVersion": 2}, {}, "append", None),
        ({"minReaderVersion": 1, "minWriterVersion": 4}, {}, "append", "protocol"),
        (
            {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"],
            },
            {},
            "append",
            "deletionVectors",
        ),
        (
            {"minReaderVersion": 1, "minWriterVersion": 2},
            {"delta.appendOnly": "true"},
            "overwrite",
            "append-only",
        ),
        ({"minReaderVersion": 1, "minWriterVersion": 2}, {"delta.appendOnly": "true"}, "append", None),
    ],
)
def test_tables_needing_what_the_fleet_does_not_write_are_refused(
    protocol: dict[str, Any], config: dict[str, str], mode: str, refused: str | None
) -> None:
    state = DeltaState(protocol=protocol, metadata={"configuration": config})
    if refused is None:
        state.check_writable(mode)
    else:
        with pytest.raises(CommitStepFailed, match=refused):
            state.check_writable(mode)


def test_a_table_with_column_invariants_is_refused() -> None:
    field = {
        "name": "n",
        "type": "long",
        "nullable": True,
        "metadata": {"delta.invariants": '{"expression": "n > 0"}'},
    }
    schema = msgspec.json.encode({"type": "struct", "fields": [field]}).decode()
    state = DeltaState(
        protocol={"minReaderVersion": 1, "minWriterVersion": 2}, metadata={"schemaString": schema}
    )
    with pytest.raises(CommitStepFailed, match="invariants"):
        state.check_writable("append")


def test_schema_mismatch_names_the_column() -> None:
    table, _ = delta_schema(pa.schema([("id", pa.string()), ("amount", pa.int64())]))
    same, _ = delta_schema(pa.schema([("amount", pa.int64()), ("id", pa.string())]))
    fewer, _ = delta_schema(pa.schema([("id", pa.string())]))
    extra, _ = delta_schema(pa.schema([("id", pa.string()), ("note", pa.string())]))
    other, _ = delta_schema(pa.schema([("id", pa.string()), ("amount", pa.int32())]))
    assert schema_mismatch(table, same, []) is None
    assert schema_mismatch(table, fewer, []) is None  # a nullable column the file lacks: nulls
    assert "note" in (schema_mismatch(table, extra, []) or "")
    assert "amount" in (schema_mismatch(table, other, []) or "")


def test_nanosecond_timestamps_get_bounds_from_the_footers_raw_values() -> None:
    """pyarrow cannot make a datetime of a nanosecond bound (without pandas it raises): the raw count does."""
    t = pa.table(
        {
            "ns": pa.array([1_000_001, 5_999_999_999], pa.timestamp("ns")),
            "nstz": pa.array([-1, 0], pa.timestamp("ns", tz="UTC")),
        }
    )
    buf = io.BytesIO()
    pq.write_table(t, buf, coerce_timestamps=None, version="2.6")
    stats = file_stats(pq.read_metadata(io.BytesIO(buf.getvalue())))
    assert (stats["minValues"]["ns"], stats["maxValues"]["ns"]) == (
        "1970-01-01T00:00:00.001",
        "1970-01-01T00:00:06.000",
    )
    assert (stats["minValues"]["nstz"], stats["maxValues"]["nstz"]) == (
        "1969-12-31T23:59:59.999Z",
        "1970-01-01T00:00:00.000Z",
    )
