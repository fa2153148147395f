"""A written Parquet file's statistics as the contract carries them (``StagedFile.stats``).

:func:`parquet_file_stats` reads pyarrow's ``FileMetaData`` of a file the task has
just written and sums its row groups the way pyiceberg sums them when it
reads the footer (``data_file_statistics_from_parquet_metadata``), so the
table step builds the same data file from either. Where that cannot be
exact, the file gets no statistics and the fleet reads its footer as
before: a nested column, a type outside the contract's (unsigned 32/64-bit
integers, nanosecond timestamps, a time zone other than UTC, ...), Parquet
field ids in the schema, too many columns or row groups.

One deliberate difference: a column with values in a row group that has no
bounds (pyarrow leaves them out for a value longer than its statistics limit)
gets no bounds at all, where pyiceberg keeps the other row groups' (then
not the file's: a reader would skip the file for a value it holds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ..events import (
    MAX_BOUND_CHARS,
    MAX_SPLIT_OFFSETS,
    MAX_STATS_COLUMNS,
    ColumnStats,
    FileStats,
    encode_bound,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

_UTC: Final = frozenset({"UTC", "+00:00", "Etc/UTC", "Z"})
_FIELD_ID_KEY: Final = b"PARQUET:field_id"


def iceberg_type(t: pa.DataType) -> str | None:
    """Return the contract's (Iceberg's) type name of an Arrow column type, or None when it has none."""
    import pyarrow as pa

    types = pa.types
    if types.is_boolean(t):
        return "boolean"
    if types.is_signed_integer(t) or t in (pa.uint8(), pa.uint16()):
        return "long" if t.bit_width == 64 else "int"
    if types.is_float32(t):
        return "float"
    if types.is_float64(t):
        return "double"
    if isinstance(t, pa.Decimal128Type):
        return f"decimal({t.precision},{t.scale})"
    if types.is_string(t) or types.is_large_string(t):
        return "string"
    if types.is_binary(t) or types.is_large_binary(t):
        return "binary"
    if types.is_fixed_size_binary(t) and t.byte_width <= MAX_BOUND_CHARS:
        return f"fixed[{t.byte_width}]"
    if types.is_date32(t):
        return "date"
    if isinstance(t, pa.Time64Type) and t.unit == "us":
        return "time"
    if types.is_timestamp(t) and t.unit in ("s", "ms", "us"):
        if t.tz is None:
            return "timestamp"
        return "timestamptz" if t.tz in _UTC else None
    return None


def parquet_file_stats(metadata: pq.FileMetaData) -> FileStats | None:
    """Return the file's row count and column statistics, or None when the file gets none (module doc)."""
    schema = metadata.schema.to_arrow_schema()
    if len(schema) > MAX_STATS_COLUMNS or metadata.num_row_groups > MAX_SPLIT_OFFSETS:
        return None
    if metadata.num_columns != len(schema):  # a nested column has several leaves
        return None
    cols: list[_Column] = []
    for f in schema:
        kind = iceberg_type(f.type)
        if kind is None or (f.metadata and _FIELD_ID_KEY in f.metadata):
            return None
        cols.append(_Column(f.name, kind, not f.nullable))
    offsets: list[int] = []
    for r in range(metadata.num_row_groups):
        group = metadata.row_group(r)
        first = group.column(0)
        data, dictionary = first.data_page_offset, first.dictionary_page_offset
        offsets.append(dictionary if first.has_dictionary_page and dictionary < data else data)
        for pos, col in enumerate(cols):
            chunk = group.column(pos)
            if chunk.path_in_schema != col.name:
                return None
            col.add(chunk)
    try:
        columns = {col.name: col.stats() for col in cols}
    except ValueError:  # a bound the contract cannot carry (a lone surrogate, say)
        return None
    return FileStats(rows=metadata.num_rows, offsets=sorted(offsets), columns=columns)


class _Column:
    """One column's sums over the row groups (pyiceberg's rules: see :func:`parquet_file_stats`)."""

    def __init__(self, name: str, kind: str, required: bool) -> None:
        self.name, self.kind, self.required = name, kind, required
        self.values = self.size = self.nulls = 0
        self.has_nulls = self.invalid = self.unbounded = False
        self.low: Any = None
        self.high: Any = None

    def add(self, chunk: Any) -> None:
        import pyarrow as pa

        self.size += chunk.total_compressed_size
        self.values += chunk.num_values
        if not chunk.is_stats_set:
            self.invalid = True
            return
        try:
            st = chunk.statistics
            if st.has_null_count:
                self.nulls += st.null_count
                self.has_nulls = True
            low, high = st.min, st.max
        except pa.ArrowNotImplementedError:
            self.invalid = True
            return
        if not st.has_min_max and st.num_values > 0:
            # Values without bounds (a value longer than the writer's statistics limit, 4 KiB in
            # pyarrow): the other row groups' bounds are not the file's.
            self.unbounded = True
        if low is not None:
            self.low = low if self.low is None else min(low, self.low)
        if high is not None:
            self.high = high if self.high is None else max(high, self.high)

    def stats(self) -> ColumnStats:
        if self.invalid:
            return ColumnStats(type=self.kind, required=self.required, values=self.values, size=self.size)
        low, low_cut = _cut(None if self.unbounded else self.low)
        high, high_cut = _cut(None if self.unbounded else self.high)
        return ColumnStats(
            type=self.kind,
            required=self.required,
            values=self.values,
            nulls=self.nulls if self.has_nulls else None,
            size=self.size,
            lower=None if low is None else encode_bound(self.kind, low),
            upper=None if high is None else encode_bound(self.kind, high),
            lower_cut=low_cut,
            upper_cut=high_cut,
        )


def _cut(value: Any) -> tuple[Any, bool]:
    if isinstance(value, str | bytes) and len(value) > MAX_BOUND_CHARS:
        value = value[:MAX_BOUND_CHARS]
        if isinstance(value, str):
            value.encode()  # raises ValueError (UnicodeEncodeError) on a lone surrogate
        return value, True
    if isinstance(value, str):
        value.encode()
    return value, False


__all__ = ["iceberg_type", "parquet_file_stats"]
