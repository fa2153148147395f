"""A staged Parquet file's statistics as its producer reports them (``StagedFile.stats``).

The task that writes a Parquet file has its row count and per-column
statistics at hand (the file's footer, just written); the table step of a
bound dataset needs exactly those to describe the file to the table. Sent
with the file, they spare the fleet reading every footer back.

Columns are named (top-level columns only: a file with a nested column
carries no statistics, and the fleet reads its footer) and typed with
Iceberg's primitive type names, so that a bound can be read without the
table at hand and the file's schema can be checked against the table's.
Bounds are JSON values as Iceberg's JSON single-value serialization writes
them (ints, floats, ``true``/``false``, strings; decimals, dates, times and
timestamps as strings), except that binary is base64 and that a float bound
may be one of the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (JSON has
no such numbers).

Pure: no pyarrow, no pyiceberg. The shape is checked by decoding (msgspec);
the rest (types, bounds, counts) by :func:`check_file_stats`, which intake
runs on every ``task_finished`` that carries statistics.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import math
import re
from decimal import Context, Decimal, InvalidOperation
from typing import Annotated, Any, Final

import msgspec

from ._invalid import InvalidMessage, shown

STATS_VERSION: Final = 1
"""The only version of the statistics object this code reads and writes."""

MAX_STATS_COLUMNS: Final = 256
"""At most this many columns: a wider file carries no statistics (its footer is read)."""

MAX_BOUND_CHARS: Final = 64
"""A longer string (binary) bound is sent as its first this many characters (bytes), marked cut."""

MAX_SPLIT_OFFSETS: Final = 4096
"""At most this many row groups: a file with more carries no statistics."""

_INT_RANGE: Final = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_FLOAT_WORDS: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_DECIMAL_TYPE: Final = re.compile(r"decimal\((\d{1,2}),(\d{1,2})\)")
_FIXED_TYPE: Final = re.compile(r"fixed\[(\d{1,4})\]")
_PLAIN_TYPES: Final = frozenset(
    {
        "boolean",
        "int",
        "long",
        "float",
        "double",
        "date",
        "time",
        "timestamp",
        "timestamptz",
        "string",
        "binary",
    }
)

Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Bound = Annotated[
    bool | int | float | str,
    msgspec.Meta(
        description="A bound in Iceberg's JSON single-value form for the column's type (decimals, dates, "
        'times, timestamps as strings; binary as base64; a float may be "NaN", "Infinity", '
        '"-Infinity").'
    ),
]
ColumnType = Annotated[
    str,
    msgspec.Meta(
        description="The column's Iceberg primitive type as the file holds it: boolean, int, long, float, "
        "double, decimal(P,S), date, time, timestamp, timestamptz, string, binary, fixed[L].",
        extra_json_schema={
            "pattern": r"^(boolean|int|long|float|double|date|time|timestamp|timestamptz|string|binary"
            r"|decimal\([0-9]{1,2},[0-9]{1,2}\)|fixed\[[0-9]{1,4}\])$"
        },
    ),
]


class ColumnStats(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True, gc=False
):
    """One top-level column of a Parquet file, summed over its row groups.

    ``values`` counts every value, nulls included (Parquet's ``num_values``);
    ``nulls`` is absent when a row group did not record it; ``size`` is the
    column's compressed bytes in the file. ``lower``/``upper`` are the least
    and greatest values, absent when unknown (no row group recorded them, or
    one had no statistics at all). A string (binary) bound is at most
    :data:`MAX_BOUND_CHARS` characters (bytes): ``lower_cut`` / ``upper_cut``
    say that the value is longer and the bound holds its first
    :data:`MAX_BOUND_CHARS` characters exactly (a prefix, not yet a bound:
    the reader makes one as its format wants, as Iceberg's truncation does).
    """

    type: ColumnType
    required: bool = False
    values: Count
    nulls: Count | None = None
    size: Count
    lower: Bound | None = None
    upper: Bound | None = None
    lower_cut: bool = False
    upper_cut: bool = False


class FileStats(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """A Parquet file's row count and per-column statistics (see the module doc).

    ``offsets`` are the row groups' first byte offsets (Iceberg's split
    offsets: each row group's dictionary page when it has one before its
    data, else its first data page, of its first column), ascending.
    ``columns`` are the file's columns in the file's order, by name.
    """

    v: Annotated[int, msgspec.Meta(description="Version of this statistics object; 1.")] = STATS_VERSION
    rows: Count
    offsets: Annotated[list[Count], msgspec.Meta(max_length=MAX_SPLIT_OFFSETS)]
    columns: Annotated[
        dict[Annotated[str, msgspec.Meta(min_length=1, max_length=256)], ColumnStats],
        msgspec.Meta(extra_json_schema={"maxProperties": MAX_STATS_COLUMNS}),
    ]


def type_params(type_name: str) -> tuple[str, int, int] | None:
    """Return ``(kind, a, b)`` of a known type (decimal: precision, scale; fixed: length), else None."""
    found = _KNOWN_TYPES.get(type_name)
    if found is not None:
        return found
    params = _type_params(type_name)
    if params is not None and len(_KNOWN_TYPES) < _MAX_KNOWN_TYPES:
        _KNOWN_TYPES[type_name] = params
    return params


def _type_params(type_name: str) -> tuple[str, int, int] | None:
    if type_name in _PLAIN_TYPES:
        return type_name, 0, 0
    m = _DECIMAL_TYPE.fullmatch(type_name)
    if m is not None:
        precision, scale = int(m[1]), int(m[2])
        return ("decimal", precision, scale) if 1 <= precision <= 38 and scale <= precision else None
    m = _FIXED_TYPE.fullmatch(type_name)
    if m is not None and int(m[1]) >= 1:
        return "fixed", int(m[1]), 0
    return None


# Types seen, parsed once (intake checks every column of every file): valid names only, bounded.
_KNOWN_TYPES: dict[str, tuple[str, int, int]] = {}
_MAX_KNOWN_TYPES: Final = 4096


def decode_bound(type_name: str, value: bool | int | float | str) -> Any:
    """Return the Python value of a JSON bound of a column of ``type_name``.

    boolean -> bool; int, long -> int; float, double -> float; decimal ->
    Decimal (with the type's scale); date -> date; time -> time; timestamp ->
    naive datetime; timestamptz -> aware datetime (UTC); string -> str;
    binary, fixed -> bytes.

    Raises:
        ValueError: the type is unknown or the value is not a bound of it.
    """
    params = type_params(type_name)
    if params is None:
        raise ValueError(f"unknown column type {type_name!r}")
    kind, a, b = params
    if kind == "boolean":
        if isinstance(value, bool):
            return value
    elif kind in _INT_RANGE:
        if isinstance(value, int) and not isinstance(value, bool):
            low, high = _INT_RANGE[kind]
            if low <= value <= high:
                return value
    elif kind in ("float", "double"):
        if isinstance(value, str) and value in _FLOAT_WORDS:
            return _FLOAT_WORDS[value]
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif isinstance(value, str):
        return _decode_text(kind, a, b, value)
    raise ValueError(f"{shown(str(value), 40)} is not a {type_name} bound")


def _decode_text(kind: str, a: int, b: int, value: str) -> Any:
    if kind == "string":
        return value
    if kind in ("binary", "fixed"):
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{shown(value, 40)} is not base64") from None
        if kind == "fixed" and len(raw) != a:
            raise ValueError(f"a fixed[{a}] bound of {len(raw)} bytes")
        return raw
    if kind == "decimal":
        return _decimal(value, a, b)
    try:
        if kind == "date":
            return dt.date.fromisoformat(_iso(value, 10))
        if kind == "time":
            return dt.time.fromisoformat(value) if _ISO_TIME.fullmatch(value) else _bad(value, kind)
        if kind == "timestamp":
            return dt.datetime.fromisoformat(value) if _ISO_TS.fullmatch(value) else _bad(value, kind)
        if kind == "timestamptz":
            if _ISO_TSTZ.fullmatch(value) is None:
                _bad(value, kind)
            return dt.datetime.fromisoformat(value).astimezone(dt.UTC)
    except ValueError:
        raise ValueError(f"{shown(value, 40)} is not a {kind} bound") from None
    raise ValueError(f"unknown column type {kind!r}")  # pragma: no cover - every kind is handled above


_ISO_TIME: Final = re.compile(r"\d{2}:\d{2}:\d{2}(\.\d{1,6})?")
_ISO_TS: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?")
_ISO_TSTZ: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?([+-]\d{2}:\d{2}|Z)")
DECIMAL_CONTEXT: Final = Context(prec=80)
"""For decimal(38,S) values: quantize() in the default context (28 digits) fails on a longer one."""
_DECIMAL_TEXT: Final = re.compile(r"-?(\d{1,38})(?:\.(\d{1,38}))?")


def _iso(value: str, length: int) -> str:
    if len(value) != length:
        raise ValueError(value)
    return value


def _bad(value: str, kind: str) -> Any:
    raise ValueError(f"{shown(value, 40)} is not a {kind} bound")


def _decimal(value: str, precision: int, scale: int) -> Decimal:
    m = _DECIMAL_TEXT.fullmatch(value)
    if m is None:
        raise ValueError(f"{shown(value, 40)} is not a decimal bound")
    whole, fraction = m[1], m[2] or ""
    if len(fraction) != scale:
        raise ValueError(f"{shown(value, 40)} has not the scale of decimal({precision},{scale})")
    if len(whole.lstrip("0")) + scale > precision:
        raise ValueError(f"{shown(value, 40)} has more than {precision} digits")
    try:
        return Decimal(value)
    except InvalidOperation:  # pragma: no cover - the pattern admits only plain decimals
        raise ValueError(f"{shown(value, 40)} is not a decimal bound") from None


def encode_bound(type_name: str, value: Any) -> bool | int | float | str:
    """Return the JSON form of the Python bound ``value`` of a ``type_name`` column (:func:`decode_bound`).

    Raises:
        ValueError: the type is unknown or ``value`` is not of it.
    """
    params = type_params(type_name)
    if params is None:
        raise ValueError(f"unknown column type {type_name!r}")
    kind, _, scale = params
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind in _INT_RANGE and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind in ("float", "double") and isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return value if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")
    if kind == "decimal" and isinstance(value, Decimal):
        return format(value.quantize(Decimal(1).scaleb(-scale), context=DECIMAL_CONTEXT), "f")
    if kind == "string" and isinstance(value, str):
        return value
    if kind in ("binary", "fixed") and isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if kind == "date" and type(value) is dt.date:
        return value.isoformat()
    if kind == "time" and isinstance(value, dt.time):
        return value.isoformat(timespec="microseconds")
    if kind == "timestamp" and isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.isoformat(timespec="microseconds")
    if kind == "timestamptz" and isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).isoformat(timespec="microseconds")
    raise ValueError(f"{type(value).__name__} {shown(str(value), 40)} is not a {type_name} bound")


def check_file_stats(stats: FileStats, size: int, where: str) -> None:
    """Return when ``stats`` are well formed for a file of ``size`` bytes (the checks decoding cannot make).

    Checks the version, each column's type and bounds (``lower <= upper``,
    string and binary bounds of at most :data:`MAX_BOUND_CHARS`, cut ones of
    exactly that many), ``nulls <= values``,
    and that the split offsets ascend inside the file. ``where`` is the
    JSON path of ``stats`` for the detail.

    Raises:
        InvalidMessage: ``unsupported_version`` (another ``v``) or ``schema``.
    """
    if stats.v != STATS_VERSION:
        raise InvalidMessage(
            "unsupported_version",
            f"statistics version {stats.v} is not supported (this consumer reads v{STATS_VERSION})"
            f" - at `{where}.v`",
        )
    if len(stats.columns) > MAX_STATS_COLUMNS:
        raise InvalidMessage("schema", f"more than {MAX_STATS_COLUMNS} columns - at `{where}.columns`")
    last = -1
    for i, offset in enumerate(stats.offsets):
        if offset <= last or offset >= max(size, 1):
            raise InvalidMessage(
                "schema", f"split offset {offset} is not ascending in the file - at `{where}.offsets[{i}]`"
            )
        last = offset
    for name, col in stats.columns.items():
        try:
            _check_column(col)
        except _Bad as bad:
            at = f"{where}.columns[{shown(name, 40)}]{bad.field}"
            raise InvalidMessage("schema", f"{bad.args[0]} - at `{at}`") from None


class _Bad(Exception):
    """A column's statistics are malformed: what, and the field (``.lower``...) where."""

    def __init__(self, what: str, field: str = "") -> None:
        super().__init__(what)
        self.field = field


def _check_column(col: ColumnStats) -> None:
    """Return when the column's statistics are well formed. Raises _Bad."""
    params = type_params(col.type)
    if params is None:
        raise _Bad(f"unknown column type {shown(col.type, 40)}", ".type")
    if col.nulls is not None and col.nulls > col.values:
        raise _Bad(f"{col.nulls} nulls of {col.values} values", ".nulls")
    text = params[0] == "string" or params[0] == "binary"
    lower = upper = None
    if col.lower is not None:
        lower = _bound(col.type, col.lower, col.lower_cut, text, "lower")
    elif col.lower_cut:
        raise _Bad("lower_cut without a lower bound", ".lower_cut")
    if col.upper is not None:
        upper = _bound(col.type, col.upper, col.upper_cut, text, "upper")
    elif col.upper_cut:
        raise _Bad("upper_cut without an upper bound", ".upper_cut")
    if lower is not None and upper is not None and _greater(lower, upper):
        raise _Bad("the lower bound is above the upper bound")


def _bound(type_name: str, value: bool | int | float | str, cut: bool, text: bool, side: str) -> Any:
    try:
        bound = decode_bound(type_name, value)
    except ValueError as exc:
        raise _Bad(str(exc), f".{side}") from None
    if cut and not text:
        raise _Bad(f"a {type_name} column's bounds cannot be cut", f".{side}_cut")
    if text and (len(bound) > MAX_BOUND_CHARS or (cut and len(bound) != MAX_BOUND_CHARS)):
        raise _Bad(f"a bound is at most {MAX_BOUND_CHARS} characters or bytes, as many when cut", f".{side}")
    return bound


def _greater(lower: Any, upper: Any) -> bool:
    if type(lower) is float and (math.isnan(lower) or math.isnan(upper)):
        return False  # a NaN bound orders with nothing
    # Strings compare by code point, which is Iceberg's order (their UTF-8 bytes).
    return bool(lower > upper)


__all__ = [
    "DECIMAL_CONTEXT",
    "MAX_BOUND_CHARS",
    "MAX_SPLIT_OFFSETS",
    "MAX_STATS_COLUMNS",
    "STATS_VERSION",
    "ColumnStats",
    "FileStats",
    "check_file_stats",
    "decode_bound",
    "encode_bound",
    "type_params",
]
