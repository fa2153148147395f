"""Hive-style partition folders (``col=value/``) for staged Parquet files (pure).

Names and values are escaped the way Hive and Spark escape them (``%XX`` for
``/``, ``=``, ``%``, control characters and a few others), so readers that
understand Hive partitioning (pyarrow, Spark, Trino) decode them back. A null
value becomes ``__HIVE_DEFAULT_PARTITION__``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from .._errors import BadInput

if TYPE_CHECKING:
    import pyarrow as pa

HIVE_NULL: Final = "__HIVE_DEFAULT_PARTITION__"
# The characters Hive's FileUtils.escapePathName escapes (besides control characters).
_ESCAPED: Final = frozenset("\"#%'*/:=?\\{[]^\x7f")
_MAX_SEGMENT_BYTES: Final = 255


def escape_path_name(text: str) -> str:
    """Return ``text`` with Hive's path escaping applied (``a/b`` -> ``a%2Fb``)."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED or ord(c) < 0x20 else c for c in text)


def format_partition_value(value: Any) -> str:
    """Return the text form of a partition value as Spark writes it (before escaping).

    Booleans are ``true``/``false``, dates ISO ``YYYY-MM-DD``, timestamps
    ``YYYY-MM-DD HH:MM:SS[.ffffff]``, everything else ``str(value)``.
    """
    if value is None:
        return HIVE_NULL
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def partition_dir(columns: Sequence[str], values: Sequence[Any]) -> str:
    """Return ``col1=v1/col2=v2/`` for one combination of partition values.

    Raises:
        BadInput: a folder name would be over 255 bytes.
    """
    segments = []
    for col, value in zip(columns, values, strict=True):
        text = HIVE_NULL if value is None else escape_path_name(format_partition_value(value))
        segment = f"{escape_path_name(col)}={text}"
        if len(segment.encode()) > _MAX_SEGMENT_BYTES:
            raise BadInput(f"partition folder {segment[:60]!r}... is over {_MAX_SEGMENT_BYTES} bytes")
        segments.append(segment)
    return "".join(f"{s}/" for s in segments)


def check_partition_columns(partition_by: Sequence[str], schema_names: Sequence[str]) -> tuple[str, ...]:
    """Return ``partition_by`` as a tuple once it names usable partition columns.

    Raises:
        BadInput: a column is missing, repeated, starts with ``_`` (a first
            folder starting with ``_`` is reserved in the staging layout), or
            every column of the schema would become a folder (no data left).
    """
    cols = tuple(partition_by)
    missing = [c for c in cols if c not in schema_names]
    if missing:
        raise BadInput(f"partition_by columns not in the DataFrame: {missing}")
    if len(set(cols)) != len(cols):
        raise BadInput(f"partition_by repeats a column: {list(cols)}")
    if any(c.startswith("_") for c in cols):
        raise BadInput(f"partition_by columns must not start with '_': {list(cols)}")
    if cols and len(set(cols)) >= len(set(schema_names)):
        raise BadInput("partition_by cannot use every column: no data columns would be left")
    return cols


def split_table(table: pa.Table, partition_by: Sequence[str]) -> list[tuple[str, pa.Table]]:
    """Split ``table`` into ``(folder, rows without the partition columns)`` per value combination.

    Returns ``[("", table)]`` when ``partition_by`` is empty; otherwise one
    entry per distinct combination, in order of first appearance, each folder
    ending with ``/``. An empty table gives no entries.
    """
    if not partition_by:
        return [("", table)]
    if table.num_rows == 0:
        return []
    import pyarrow as pa

    keys = list(zip(*(table.column(c).to_pylist() for c in partition_by), strict=True))
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    data = table.drop_columns(list(partition_by))
    return [
        (partition_dir(partition_by, key), data.take(pa.array(rows, type=pa.int64())))
        for key, rows in groups.items()
    ]


__all__ = [
    "HIVE_NULL",
    "check_partition_columns",
    "escape_path_name",
    "format_partition_value",
    "partition_dir",
    "split_table",
]
