"""The Delta Lake transaction log, the pure part: one commit's actions, and the state a log replays to.

No I/O here (the step in :mod:`._delta` reads and writes through the store
port). What the fleet writes (Delta protocol, reader 1 / writer 2, or reader 3
/ writer 7 with ``timestampNtz`` when a column needs it):

- the first commit (version 0): ``protocol`` and ``metaData`` (the schema
  converted from the first Parquet file's Arrow schema, the partition columns
  from its Hive folders);
- every commit: ``commitInfo`` (with ``commitfleet: {job, dataset}``), one
  ``txn`` (``appId`` = the dataset's binding id, ``version`` = the job's
  sequence for the dataset, see :mod:`._delta`), one ``add`` per published Parquet file (path
  relative to the table and URL-encoded, size, partition values, statistics
  JSON); ``overwrite`` also one ``remove`` per file of the current snapshot.

Replay covers JSON commits and classic (single- or multi-part Parquet)
checkpoints; a table that needs reader or writer features the fleet does not
write (deletion vectors, column mapping, constraints...) is refused.
"""

from __future__ import annotations

import datetime
import io
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, unquote

import msgspec

from ..events import DECIMAL_CONTEXT, MAX_BOUND_CHARS, FileStats, decode_bound, type_params
from ._errors import CommitStepFailed

if TYPE_CHECKING:
    import pyarrow as pa

DELTA_LOG: Final = "_delta_log"
COMMITFLEET_INFO: Final = "commitfleet"
"""The key of ``commitInfo`` that names the job and dataset of a fleet commit."""
HIVE_NULL: Final = "__HIVE_DEFAULT_PARTITION__"
STRING_STATS_MAX: Final = 32
"""Delta's default prefix length for string statistics."""

# What the fleet can honour when it writes to a table someone else created.
_READER_FEATURES: Final = frozenset({"timestampNtz"})
_WRITER_FEATURES: Final = frozenset({"timestampNtz", "appendOnly"})

_COMMIT_RE: Final = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_RE: Final = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")

_encoder = msgspec.json.Encoder()


def app_id(dataset: str) -> str:
    """Return the ``txn`` application id of the fleet's commits to ``dataset``'s table: its binding id."""
    return f"commitfleet/{dataset}"


def commit_name(version: int) -> str:
    """Return the log file name of ``version``: 20 digits and ``.json``."""
    return f"{version:020d}.json"


def encode_path(rel: str) -> str:
    """Return the ``add.path`` of a file at ``rel`` under the table root (a URI path: percent-encoded)."""
    return quote(rel, safe="/=")


def decode_path(path: str) -> str:
    """Return the key of an ``add``/``remove`` path relative to the table root (inverse of encode_path)."""
    return unquote(path)


# ---------------------------------------------------------------- schema


def _delta_type(t: pa.DataType, where: str) -> tuple[Any, bool]:
    """Return the Delta type of the Arrow type ``t`` and whether it needs ``timestampNtz``.

    Raises:
        CommitStepFailed: a type Delta has no equal for (unsigned 64-bit, null, ...).
    """
    import pyarrow as pa

    simple: list[tuple[Any, str]] = [
        (pa.types.is_boolean, "boolean"),
        (pa.types.is_int8, "byte"),
        (pa.types.is_int16, "short"),
        (pa.types.is_int32, "integer"),
        (pa.types.is_int64, "long"),
        (pa.types.is_uint8, "short"),
        (pa.types.is_uint16, "integer"),
        (pa.types.is_uint32, "long"),
        (pa.types.is_float32, "float"),
        (pa.types.is_float64, "double"),
        (pa.types.is_date32, "date"),
    ]
    for test, name in simple:
        if test(t):
            return name, False
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string", False
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary", False
    if pa.types.is_decimal(t) and t.precision <= 38:
        return f"decimal({t.precision},{t.scale})", False
    if pa.types.is_timestamp(t):
        return ("timestamp", False) if t.tz is not None else ("timestamp_ntz", True)
    if pa.types.is_struct(t):
        fields, ntz = _delta_fields([t.field(i) for i in range(t.num_fields)], where)
        return {"type": "struct", "fields": fields}, ntz
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        elem, ntz = _delta_type(t.value_type, f"{where}.element")
        return {"type": "array", "elementType": elem, "containsNull": t.value_field.nullable}, ntz
    if pa.types.is_map(t):
        key, k_ntz = _delta_type(t.key_type, f"{where}.key")
        value, v_ntz = _delta_type(t.item_type, f"{where}.value")
        return {
            "type": "map",
            "keyType": key,
            "valueType": value,
            "valueContainsNull": t.item_field.nullable,
        }, k_ntz or v_ntz
    raise CommitStepFailed(f"column {where}: Arrow type {t} has no Delta Lake equal")


def _delta_fields(fields: Iterable[pa.Field], where: str = "") -> tuple[list[dict[str, Any]], bool]:
    out: list[dict[str, Any]] = []
    ntz = False
    for f in fields:
        name = f"{where}.{f.name}" if where else f.name
        dtype, needs = _delta_type(f.type, name)
        ntz = ntz or needs
        out.append({"name": f.name, "type": dtype, "nullable": f.nullable, "metadata": {}})
    return out, ntz


def delta_schema(schema: pa.Schema, partition_columns: Sequence[str] = ()) -> tuple[dict[str, Any], bool]:
    """Return the Delta schema of a Parquet file's Arrow schema, and whether it needs ``timestampNtz``.

    Partition columns the file does not hold (Hive folders drop them) are
    added as nullable strings.

    Raises:
        CommitStepFailed: a column type Delta has no equal for.
    """
    fields, ntz = _delta_fields(schema)
    have = {f["name"] for f in fields}
    for col in partition_columns:
        if col not in have:
            fields.append({"name": col, "type": "string", "nullable": True, "metadata": {}})
    return {"type": "struct", "fields": fields}, ntz


# ---------------------------------------------------------------- statistics and partitions


_EPOCH: Final = datetime.datetime(1970, 1, 1)
_PER_MS: Final = {"ms": 1, "us": 1000, "ns": 1_000_000}


def timestamp_bound(value: int, unit: str, tz: bool, upper: bool) -> str | None:
    """Return the Delta ``minValues``/``maxValues`` entry of a timestamp bound, or None (out of range).

    ``value`` counts ``unit`` (s, ms, us, ns) since the epoch. Delta keeps
    milliseconds: a minimum is cut down to them, a maximum rounded up (so it
    is an upper bound to any reader: delta-rs cuts it down, below the value,
    which only readers that widen it by a millisecond, as delta-rs does, take right).
    With ``tz`` (Delta ``timestamp``) ``2024-01-01T12:00:00.123Z``; without
    (``timestamp_ntz``) the same without the ``Z``, the form Spark's JSON
    writes (delta-rs writes a space for the ``T``; it reads both).
    """
    if unit == "s":
        ms = value * 1000
    else:
        per = _PER_MS[unit]
        ms = -(-value // per) if upper else value // per
    try:
        text = (_EPOCH + datetime.timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
    except OverflowError:
        return None
    return text + "Z" if tz else text


def decimal_bound(value: Decimal, scale: int) -> msgspec.Raw:
    """Return a decimal bound as the exact JSON number of its scale (``-0.05``, never an exponent)."""
    return msgspec.Raw(
        format(value.quantize(Decimal(1).scaleb(-scale), context=DECIMAL_CONTEXT), "f").encode()
    )


def _bound_kind(t: pa.DataType) -> tuple[str, Any] | None:
    """Return how the Delta statistics bound a column of Arrow type ``t`` (kind, and the unit and time
    zone of a timestamp or the scale of a decimal), or None: no bounds (see :func:`file_stats`)."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_boolean(t):
        return "boolean", None
    if pa.types.is_integer(t) and not pa.types.is_uint64(t):
        return "int", None
    if pa.types.is_date32(t):
        return "date", None
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string", None
    if pa.types.is_decimal(t) and t.precision <= 38:
        return "decimal", t.scale
    if pa.types.is_timestamp(t):
        return "timestamp", (t.unit, t.tz is not None)
    return None  # floats (Parquet's bounds leave NaN out), binaries, ...


_ASCII_TOP: Final = "\x7f"
_UNICODE_TOP: Final = "\U0010ffff"


def string_max(value: str, longer: bool) -> str | None:
    """Return the Delta ``maxValues`` entry of a string column whose greatest value starts with ``value``.

    ``longer``: the value goes on past ``value``. At most 32 characters: the
    value itself. Longer: its first 32 characters and a tie-breaker greater
    than the character cut off (DEL after an ASCII character below DEL, else
    U+10FFFF; a cut-off U+10FFFF stays in the prefix and the next one is
    looked at), as Delta's kernel writes it: still an upper bound. None when
    every character of ``value`` past the 32nd is U+10FFFF and it goes on.
    """
    if len(value) <= STRING_STATS_MAX and not longer:
        return value
    for n in range(STRING_STATS_MAX, len(value)):
        cut = value[n]
        if cut != _UNICODE_TOP:
            return value[:n] + (_ASCII_TOP if cut < _ASCII_TOP else _UNICODE_TOP)
    return None if longer else value


def file_stats(meta: Any) -> dict[str, Any]:
    """Return the Delta statistics of a Parquet file from its footer (``pyarrow.parquet.FileMetaData``).

    ``numRecords`` always; ``nullCount`` for top-level primitive columns whose
    every row group carries it; ``minValues``/``maxValues`` for top-level
    integer, date, string, boolean, decimal and timestamp columns (a string
    minimum is cut to 32 characters, a longer maximum cut and given a
    tie-breaker: :func:`string_max`, from the value's first 64 characters, as
    the statistics carry them; timestamps in milliseconds:
    :func:`timestamp_bound`; decimals exact: :func:`decimal_bound`). No
    bounds for floats: Parquet's leave NaN out, which Spark and DataFusion
    order above every number, so a reader would skip a file whose NaN
    matches ``x > bound`` (delta-rs writes them and loses such rows: tested);
    none for binaries either.
    """
    stats: dict[str, Any] = {"numRecords": meta.num_rows}
    nulls: dict[str, int] = {}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    schema = meta.schema
    arrow = schema.to_arrow_schema() if meta.num_columns else None
    for i in range(meta.num_columns):
        col = schema.column(i)
        if "." in col.path or col.max_repetition_level > 0:
            continue  # nested: not collected
        name = col.path
        groups = [meta.row_group(g).column(i).statistics for g in range(meta.num_row_groups)]
        if meta.num_row_groups == 0 or any(s is None for s in groups):
            continue
        if all(s.has_null_count for s in groups):
            nulls[name] = sum(s.null_count for s in groups)
        with_values = [s for s in groups if s.has_min_max]
        if not with_values or len(with_values) != len([s for s in groups if s.num_values > 0]):
            continue
        found = _bound_kind(arrow.field(name).type) if arrow is not None else None
        if found is None:
            continue
        kind, extra = found
        if kind == "timestamp":
            if col.physical_type != "INT64":
                continue  # INT96: no defined order
            lo, hi = [s.min_raw for s in with_values], [s.max_raw for s in with_values]
        else:
            lo, hi = [s.min for s in with_values], [s.max for s in with_values]
        low, high = min(lo), max(hi)
        if kind == "string":
            mins[name] = low[:STRING_STATS_MAX]
            top = string_max(high[:MAX_BOUND_CHARS], len(high) > MAX_BOUND_CHARS)
            if top is not None:
                maxs[name] = top
        else:
            _put_bounds(mins, maxs, name, kind, extra, low, high)
    stats["minValues"] = mins
    stats["maxValues"] = maxs
    stats["nullCount"] = nulls
    return stats


def _put_bounds(
    mins: dict[str, Any], maxs: dict[str, Any], name: str, kind: str, extra: Any, low: Any, high: Any
) -> None:
    """Put a non-string column's bounds as Delta writes them (a timestamp's as counts of its unit)."""
    if kind == "timestamp":
        unit, tz = extra
        for out, value, upper in ((mins, low, False), (maxs, high, True)):
            text = timestamp_bound(value, unit, tz, upper)
            if text is not None:
                out[name] = text
    elif kind == "decimal":
        mins[name], maxs[name] = decimal_bound(low, extra), decimal_bound(high, extra)
    elif kind == "date":
        mins[name], maxs[name] = low.isoformat(), high.isoformat()
    else:
        mins[name], maxs[name] = low, high


_STATS_TYPES: Final = {
    "boolean": "boolean",
    "long": "long",
    "float": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp_ntz",
    "timestamptz": "timestamp",
    "string": "string",
    "binary": "binary",
    "fixed": "binary",
}
"""The Delta type of each statistics (Iceberg) type that names one exactly; ``int`` does not (an
8-, 16- or 32-bit integer column: Delta's byte, short, integer), ``time`` has no Delta equal."""


def stats_type(type_name: str, table_type: Any = None) -> Any:
    """Return the Delta type of a column whose statistics say ``type_name``, or None when they cannot tell.

    ``int`` is Delta's ``integer`` only against a table column of type
    ``integer`` (``table_type``): a file written with 8- or 16-bit integers
    holds them as Parquet INT32 too, which Delta readers read as ``integer``;
    against ``byte`` or ``short``, and with no table yet, the footer tells.
    """
    params = type_params(type_name)
    if params is None:
        return None
    kind, precision, scale = params
    if kind == "decimal":
        return f"decimal({precision},{scale})"
    if kind == "int":
        return "integer" if table_type == "integer" else None
    return _STATS_TYPES.get(kind)


def schema_from_stats(
    stats: FileStats, partition_columns: Sequence[str] = (), table: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], bool] | None:
    """Return the Delta schema of a file from its statistics, and whether it needs ``timestampNtz``.

    What :func:`delta_schema` gives from the file's footer, or None when the
    statistics cannot tell it exactly (see :func:`stats_type`; ``table``: the
    table's schema, for the integer columns).
    """
    types = {f["name"]: f["type"] for f in (table or {}).get("fields", [])}
    fields: list[dict[str, Any]] = []
    ntz = False
    for name, col in stats.columns.items():
        dtype = stats_type(col.type, types.get(name))
        if dtype is None:
            return None
        ntz = ntz or dtype == "timestamp_ntz"
        fields.append({"name": name, "type": dtype, "nullable": not col.required, "metadata": {}})
    for part in partition_columns:
        if part not in stats.columns:
            fields.append({"name": part, "type": "string", "nullable": True, "metadata": {}})
    return {"type": "struct", "fields": fields}, ntz


_BOUNDED_KINDS: Final = frozenset(
    {"boolean", "int", "long", "date", "string", "decimal", "timestamp", "timestamptz"}
)
_MICROSECOND: Final = datetime.timedelta(microseconds=1)


def add_stats_from_stats(stats: FileStats) -> dict[str, Any]:
    """Return the Delta statistics of a file from the statistics its producer sent.

    The same as :func:`file_stats` gives from the file's footer: ``numRecords``;
    ``nullCount`` where the producer had every row group's; bounds of integer,
    date, string, boolean, decimal and timestamp columns only (a cut string
    bound holds the value's first 64 characters, so the minimum's first 32 are
    exact, and the maximum is made from them by :func:`string_max`, as the
    footer read makes it; a timestamp's microseconds go to milliseconds as
    there). Dates are ISO in both forms. Top-level names with a dot are left
    out, as the footer read leaves them (their Parquet path reads like a nested
    column). Bounds were checked on intake (:func:`shared.events.check_file_stats`);
    a column whose bounds do not decode anyway gets none.
    """
    nulls: dict[str, int] = {}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    for name, col in stats.columns.items():
        if "." in name:
            continue
        if col.nulls is not None:
            nulls[name] = col.nulls
        params = type_params(col.type)
        if params is None or params[0] not in _BOUNDED_KINDS or col.lower is None or col.upper is None:
            continue
        kind = params[0]
        if kind == "string":
            if not isinstance(col.lower, str) or not isinstance(col.upper, str):
                continue  # checked on intake: a string column's bounds are strings
            mins[name] = col.lower[:STRING_STATS_MAX]
            top = string_max(col.upper, col.upper_cut)
            if top is not None:
                maxs[name] = top
            continue
        try:
            low, high = decode_bound(col.type, col.lower), decode_bound(col.type, col.upper)
        except ValueError:
            continue
        if kind in ("timestamp", "timestamptz"):
            epoch = _EPOCH if kind == "timestamp" else _EPOCH.replace(tzinfo=datetime.UTC)
            low, high = (low - epoch) // _MICROSECOND, (high - epoch) // _MICROSECOND
            _put_bounds(mins, maxs, name, "timestamp", ("us", kind == "timestamptz"), low, high)
        elif kind == "decimal":
            _put_bounds(mins, maxs, name, kind, params[2], low, high)
        else:
            _put_bounds(mins, maxs, name, "date" if kind == "date" else "int", None, low, high)
    return {"numRecords": stats.rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def partition_values(rel: str) -> dict[str, str | None]:
    """Return the Hive partition values of a file at ``rel`` under the table root (``k=v/`` folders).

    Values are unescaped; ``__HIVE_DEFAULT_PARTITION__`` is null.
    """
    out: dict[str, str | None] = {}
    for part in rel.split("/")[:-1]:
        key, eq, value = part.partition("=")
        if not eq or not key:
            return {}  # not a Hive layout: the file is unpartitioned
        v = unquote(value)
        out[unquote(key)] = None if v == HIVE_NULL else v
    return out


# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class AddFile:
    """One data file the commit adds: its path under the table root, size, partition values, statistics."""

    rel: str
    size: int
    partition: dict[str, str | None]
    stats: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class NewTable:
    """The first commit's table: its schema (Delta JSON), partition columns, whether it needs timestampNtz."""

    schema: dict[str, Any]
    partition_columns: list[str]
    ntz: bool


def commit_body(
    *,
    dataset: str,
    job: str,
    version: int,
    txn_version: int,
    mode: str,
    adds: Sequence[AddFile],
    removes: Sequence[Mapping[str, Any]],
    new_table: NewTable | None,
    now_ms: int,
    extra_info: Mapping[str, str] | None = None,
) -> bytes:
    """Return the newline-delimited JSON of the commit that lands ``job``'s files at ``version``.

    ``txn_version`` is the version of its ``txn`` (the job's sequence);
    ``removes`` are the ``add`` actions of the current snapshot (overwrite);
    ``new_table`` is given for the first commit only.
    """
    overwrite = mode == "overwrite"
    info: dict[str, Any] = {
        "timestamp": now_ms,
        "operation": "CREATE TABLE" if new_table is not None and not overwrite else "WRITE",
        "operationParameters": {"mode": "Overwrite" if overwrite else "Append"},
        "isBlindAppend": not overwrite,
        "clientVersion": "commitfleet",
        COMMITFLEET_INFO: {"job": job, "dataset": dataset, **(extra_info or {})},
    }
    actions: list[dict[str, Any]] = [{"commitInfo": info}]
    if new_table is not None:
        protocol: dict[str, Any] = {"minReaderVersion": 1, "minWriterVersion": 2}
        if new_table.ntz:
            protocol = {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["timestampNtz"],
                "writerFeatures": ["timestampNtz"],
            }
        actions.append({"protocol": protocol})
        actions.append(
            {
                "metaData": {
                    "id": str(uuid.uuid4()),
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": _encoder.encode(new_table.schema).decode(),
                    "partitionColumns": list(new_table.partition_columns),
                    "configuration": {},
                    "createdTime": now_ms,
                }
            }
        )
    actions.append({"txn": {"appId": app_id(dataset), "version": txn_version, "lastUpdated": now_ms}})
    for old in removes:
        rm: dict[str, Any] = {
            "path": old["path"],
            "deletionTimestamp": now_ms,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": old.get("partitionValues") or {},
            "size": old.get("size", 0),
        }
        actions.append({"remove": rm})
    for a in adds:
        add: dict[str, Any] = {
            "path": encode_path(a.rel),
            "partitionValues": a.partition,
            "size": a.size,
            "modificationTime": now_ms,
            "dataChange": True,
        }
        if a.stats is not None:
            add["stats"] = _encoder.encode(a.stats).decode()
        actions.append({"add": add})
    return b"\n".join(_encoder.encode(a) for a in actions) + b"\n"


# ---------------------------------------------------------------- replay


@dataclass
class DeltaState:
    """A table's state at ``version``: what the fleet needs to commit on top of it and to audit it.

    ``files``: the current snapshot's ``add`` actions by path; ``txns``: the
    latest version of each application id; ``txn_at``: the table version
    whose commit set it, for those a replayed JSON commit set (not those a
    checkpoint holds: it keeps no table version of a ``txn``);
    ``fleet_commits``: version -> (dataset, job) of the fleet's commits
    replayed from JSON (a checkpoint keeps no ``commitInfo``); ``checkpoint``:
    the version of the checkpoint the replay started from (-1: none).
    """

    version: int = -1
    protocol: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    txns: dict[str, int] = field(default_factory=dict)
    txn_at: dict[str, int] = field(default_factory=dict)
    fleet_commits: dict[int, tuple[str, str]] = field(default_factory=dict)
    checkpoint: int = -1

    def copy(self) -> DeltaState:
        """Return a copy that replaying more commits onto leaves this one as it is."""
        return DeltaState(
            version=self.version,
            protocol=self.protocol,
            metadata=self.metadata,
            files=dict(self.files),
            txns=dict(self.txns),
            txn_at=dict(self.txn_at),
            fleet_commits=dict(self.fleet_commits),
            checkpoint=self.checkpoint,
        )

    def apply(self, version: int, body: bytes, where: str) -> None:
        """Replay one JSON commit onto this state.

        Raises:
            CommitStepFailed: the commit is not newline-delimited JSON actions.
        """
        for n, line in enumerate(body.splitlines()):
            if not line.strip():
                continue
            try:
                action = msgspec.json.decode(line)
            except msgspec.DecodeError as exc:
                raise CommitStepFailed(f"{where}: line {n + 1} is not JSON: {exc}") from exc
            if not isinstance(action, dict):
                raise CommitStepFailed(f"{where}: line {n + 1} is not an action")
            try:
                self._action(action, version)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise CommitStepFailed(f"{where}: line {n + 1} is a malformed action: {exc!r}") from exc
        self.version = version

    def _action(self, action: dict[str, Any], version: int) -> None:
        if (add := action.get("add")) is not None:
            self.files[add["path"]] = add
        elif (rm := action.get("remove")) is not None:
            self.files.pop(rm["path"], None)
        elif (txn := action.get("txn")) is not None:
            self.txns[txn["appId"]] = int(txn["version"])
            if version >= 0:
                self.txn_at[txn["appId"]] = version
            else:  # from a checkpoint: the table version that set it is not known
                self.txn_at.pop(txn["appId"], None)
        elif (md := action.get("metaData")) is not None:
            self.metadata = md
        elif (proto := action.get("protocol")) is not None:
            self.protocol = proto
        elif (info := action.get("commitInfo")) is not None:
            mine = info.get(COMMITFLEET_INFO) if isinstance(info, dict) else None
            if isinstance(mine, dict) and "job" in mine and "dataset" in mine:
                self.fleet_commits[version] = (str(mine["dataset"]), str(mine["job"]))

    def apply_checkpoint(self, version: int, parts: Sequence[bytes], where: str) -> None:
        """Load a classic Parquet checkpoint (all its parts) as the state at ``version``.

        Raises:
            CommitStepFailed: a part is not a readable checkpoint.
        """
        import pyarrow.parquet as pq

        for part in parts:
            try:
                rows = pq.read_table(io.BytesIO(part)).to_pylist()
            except Exception as exc:  # pyarrow raises its own errors on a bad file
                raise CommitStepFailed(f"{where}: unreadable checkpoint: {exc}") from exc
            for row in rows:
                for kind in ("add", "txn", "metaData", "protocol"):
                    value = row.get(kind)
                    if value is not None:
                        self._action({kind: _from_checkpoint(value)}, -1)
        self.version = version
        self.checkpoint = version

    def partition_columns(self) -> list[str]:
        """Return the table's partition columns (none before its first commit)."""
        return list((self.metadata or {}).get("partitionColumns") or [])

    def schema(self) -> dict[str, Any]:
        """Return the table's schema (a Delta ``struct``).

        Raises:
            CommitStepFailed: the table has no metadata, or its schema is not JSON.
        """
        if self.metadata is None:
            raise CommitStepFailed("the Delta table has no metaData action")
        try:
            out = msgspec.json.decode(self.metadata["schemaString"])
        except (KeyError, msgspec.DecodeError) as exc:
            raise CommitStepFailed(f"the Delta table's schema is unreadable: {exc}") from exc
        if not isinstance(out, dict):
            raise CommitStepFailed("the Delta table's schema is not a struct")
        return out

    def check_writable(self, mode: str) -> None:
        """Raise CommitStepFailed unless the fleet can write ``mode`` to this table (see the module doc)."""
        proto = self.protocol or {}
        reader = int(proto.get("minReaderVersion", 1))
        writer = int(proto.get("minWriterVersion", 2))
        need_r = set(proto.get("readerFeatures") or ())
        need_w = set(proto.get("writerFeatures") or ())
        if reader > 3 or writer > 7 or (reader == 2) or (2 < writer < 7):
            raise CommitStepFailed(
                f"the Delta table needs protocol reader {reader} / writer {writer}; "
                "the fleet writes reader 1-3 / writer 2 or 7 with features timestampNtz, appendOnly"
            )
        unknown = (need_r - _READER_FEATURES) | (need_w - _WRITER_FEATURES)
        if unknown:
            raise CommitStepFailed(
                f"the Delta table needs features the fleet does not write: {', '.join(sorted(unknown))}"
            )
        if self.metadata is not None and "delta.invariants" in self.metadata.get("schemaString", ""):
            raise CommitStepFailed(
                "the Delta table has column invariants (delta.invariants): the fleet does not check them"
            )
        conf = (self.metadata or {}).get("configuration") or {}
        if mode == "overwrite" and str(conf.get("delta.appendOnly", "false")).lower() == "true":
            raise CommitStepFailed("the Delta table is append-only (delta.appendOnly): overwrite refused")


def checkpoint_interval(state: DeltaState) -> int:
    """Return how many versions apart the table wants checkpoints (``delta.checkpointInterval``, else 10)."""
    conf = (state.metadata or {}).get("configuration") or {}
    try:
        return max(1, int(conf.get("delta.checkpointInterval", 10)))
    except (TypeError, ValueError):
        return 10


def checkpoint_name(version: int) -> str:
    """Return the file name of the classic single-part checkpoint of ``version``."""
    return f"{version:020d}.checkpoint.parquet"


def _checkpoint_schema() -> Any:
    import pyarrow as pa

    def smap(nullable_values: bool = True) -> Any:
        return pa.map_(pa.string(), pa.field("value", pa.string(), nullable=nullable_values))

    strings = pa.list_(pa.field("element", pa.string(), nullable=False))
    dv = pa.struct(
        [
            pa.field("storageType", pa.string(), nullable=False),
            pa.field("pathOrInlineDv", pa.string(), nullable=False),
            pa.field("offset", pa.int32()),
            pa.field("sizeInBytes", pa.int32(), nullable=False),
            pa.field("cardinality", pa.int64(), nullable=False),
        ]
    )
    add = pa.struct(
        [
            pa.field("path", pa.string(), nullable=False),
            pa.field("partitionValues", smap(), nullable=False),
            pa.field("size", pa.int64(), nullable=False),
            pa.field("modificationTime", pa.int64(), nullable=False),
            pa.field("dataChange", pa.bool_(), nullable=False),
            pa.field("stats", pa.string()),
            pa.field("tags", smap()),
            pa.field("deletionVector", dv),
            pa.field("baseRowId", pa.int64()),
            pa.field("defaultRowCommitVersion", pa.int64()),
            pa.field("clusteringProvider", pa.string()),
        ]
    )
    remove = pa.struct(
        [
            pa.field("path", pa.string(), nullable=False),
            pa.field("deletionTimestamp", pa.int64()),
            pa.field("dataChange", pa.bool_(), nullable=False),
            pa.field("extendedFileMetadata", pa.bool_()),
            pa.field("partitionValues", smap()),
            pa.field("size", pa.int64()),
            pa.field("stats", pa.string()),
            pa.field("tags", smap()),
            pa.field("deletionVector", dv),
            pa.field("baseRowId", pa.int64()),
            pa.field("defaultRowCommitVersion", pa.int64()),
        ]
    )
    fmt = pa.struct(
        [pa.field("provider", pa.string(), nullable=False), pa.field("options", smap(False), nullable=False)]
    )
    metadata = pa.struct(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("name", pa.string()),
            pa.field("description", pa.string()),
            pa.field("format", fmt, nullable=False),
            pa.field("schemaString", pa.string(), nullable=False),
            pa.field("partitionColumns", strings, nullable=False),
            pa.field("createdTime", pa.int64()),
            pa.field("configuration", smap(False), nullable=False),
        ]
    )
    protocol = pa.struct(
        [
            pa.field("minReaderVersion", pa.int32(), nullable=False),
            pa.field("minWriterVersion", pa.int32(), nullable=False),
            pa.field("readerFeatures", strings),
            pa.field("writerFeatures", strings),
        ]
    )
    txn = pa.struct(
        [
            pa.field("appId", pa.string(), nullable=False),
            pa.field("version", pa.int64(), nullable=False),
            pa.field("lastUpdated", pa.int64()),
        ]
    )
    domain = pa.struct(
        [
            pa.field("domain", pa.string(), nullable=False),
            pa.field("configuration", pa.string(), nullable=False),
            pa.field("removed", pa.bool_(), nullable=False),
        ]
    )
    sidecar = pa.struct(
        [
            pa.field("path", pa.string(), nullable=False),
            pa.field("sizeInBytes", pa.int64(), nullable=False),
            pa.field("modificationTime", pa.int64(), nullable=False),
            pa.field("tags", smap()),
        ]
    )
    return pa.schema(
        [
            ("add", add),
            ("remove", remove),
            ("metaData", metadata),
            ("protocol", protocol),
            ("txn", txn),
            ("domainMetadata", domain),
            ("sidecar", sidecar),
        ]
    )


def _pairs(value: Any) -> list[tuple[str, Any]]:
    return list((value or {}).items())


def checkpoint_body(state: DeltaState) -> tuple[bytes, int]:
    """Return a classic single-part Parquet checkpoint of ``state``, and how many actions it holds.

    The checkpoint holds the protocol, the metadata, the txns and the current
    files (the schema delta-rs writes); removes are left out (none is needed to
    read the table). Blocking (pyarrow).

    Raises:
        CommitStepFailed: the state has no protocol or metadata.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if state.protocol is None or state.metadata is None:
        raise CommitStepFailed("cannot checkpoint a Delta table without protocol and metaData")
    rows: list[dict[str, Any]] = []
    p = state.protocol
    rows.append(
        {
            "protocol": {
                "minReaderVersion": int(p.get("minReaderVersion", 1)),
                "minWriterVersion": int(p.get("minWriterVersion", 2)),
                "readerFeatures": p.get("readerFeatures"),
                "writerFeatures": p.get("writerFeatures"),
            }
        }
    )
    m = state.metadata
    fmt = m.get("format") or {}
    rows.append(
        {
            "metaData": {
                "id": m["id"],
                "name": m.get("name"),
                "description": m.get("description"),
                "format": {"provider": fmt.get("provider", "parquet"), "options": _pairs(fmt.get("options"))},
                "schemaString": m["schemaString"],
                "partitionColumns": list(m.get("partitionColumns") or []),
                "createdTime": m.get("createdTime"),
                "configuration": _pairs(m.get("configuration")),
            }
        }
    )
    for app, version in sorted(state.txns.items()):
        rows.append({"txn": {"appId": app, "version": version, "lastUpdated": None}})
    for path, a in sorted(state.files.items()):
        rows.append(
            {
                "add": {
                    "path": path,
                    "partitionValues": _pairs(a.get("partitionValues")),
                    "size": int(a.get("size", 0)),
                    "modificationTime": int(a.get("modificationTime", 0)),
                    "dataChange": False,
                    "stats": a.get("stats"),
                    "tags": _pairs(a.get("tags")) if a.get("tags") else None,
                }
            }
        )
    table = pa.Table.from_pylist(rows, schema=_checkpoint_schema())
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue(), len(rows)


def _from_checkpoint(value: Any) -> Any:
    """Return a checkpoint row's struct as the JSON action (Arrow maps come back as key/value pairs)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in ("partitionValues", "configuration", "tags", "options") and isinstance(v, list):
                out[k] = dict(v)
            else:
                out[k] = _from_checkpoint(v) if isinstance(v, dict) else v
        return out
    return value


@dataclass(frozen=True, slots=True)
class LogListing:
    """What a listing of ``_delta_log/`` says: the commits' versions, and the newest checkpoint's parts."""

    commits: list[int]
    checkpoint: int | None
    checkpoint_parts: list[str]


def read_listing(names: Iterable[str]) -> LogListing:
    """Return the commit versions and the newest complete checkpoint of the ``names`` in ``_delta_log/``."""
    commits: list[int] = []
    checkpoints: dict[int, dict[tuple[int, int], str]] = {}
    for name in names:
        m = _COMMIT_RE.match(name)
        if m:
            commits.append(int(m.group(1)))
            continue
        c = _CHECKPOINT_RE.match(name)
        if c:
            part, total = (int(c.group(2)), int(c.group(3))) if c.group(2) else (1, 1)
            checkpoints.setdefault(int(c.group(1)), {})[(part, total)] = name
    commits.sort()
    for version in sorted(checkpoints, reverse=True):
        parts = checkpoints[version]
        totals = {t for _, t in parts}
        for total in totals:
            names_ = [parts.get((i, total)) for i in range(1, total + 1)]
            if all(names_):
                return LogListing(commits, version, [n for n in names_ if n])
    return LogListing(commits, None, [])


def schema_mismatch(
    table: Mapping[str, Any], file: Mapping[str, Any], partitions: Sequence[str]
) -> str | None:
    """Return why a file with Delta schema ``file`` cannot go into a table with schema ``table``, or None.

    Every column of the file must be in the table with the same type; every
    column of the table the file lacks must be nullable (readers fill nulls);
    partition columns live in the log, not the file.
    """
    t_fields = {f["name"]: f for f in table.get("fields", [])}
    f_fields = {f["name"]: f for f in file.get("fields", [])}
    for name, f in f_fields.items():
        if name in partitions:
            continue
        t = t_fields.get(name)
        if t is None:
            return f"column {name!r} is not in the table"
        if t["type"] != f["type"]:
            theirs, ours = _encoder.encode(f["type"]).decode(), _encoder.encode(t["type"]).decode()
            return f"column {name!r} is {theirs}, the table has {ours}"
    for name, t in t_fields.items():
        if name not in f_fields and name not in partitions and not t.get("nullable", True):
            return f"column {name!r} is not nullable and the file lacks it"
    return None


__all__ = [
    "COMMITFLEET_INFO",
    "DELTA_LOG",
    "AddFile",
    "DeltaState",
    "LogListing",
    "NewTable",
    "add_stats_from_stats",
    "app_id",
    "checkpoint_body",
    "checkpoint_interval",
    "checkpoint_name",
    "commit_body",
    "commit_name",
    "decode_path",
    "delta_schema",
    "encode_path",
    "file_stats",
    "partition_values",
    "read_listing",
    "schema_from_stats",
    "schema_mismatch",
    "stats_type",
    "string_max",
]
