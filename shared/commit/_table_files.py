"""The table step's Iceberg data files: built from the statistics the producer sent, else from footers.

pyiceberg's ``add_files`` opens every file and reads its Parquet footer to
describe it (``parquet_file_to_data_file``): the schema check against the
table, the row count, and per column the sizes, value and null counts and
the bounds. A producer that wrote the file had all of that at hand and may
send it with the file (``StagedFile.stats``, :mod:`shared.events`);
:func:`data_file_from_stats` then builds the same ``DataFile`` from it with
pyiceberg's own pieces (the table's metrics modes, the statistics plan, the
aggregators that truncate and serialize bounds, the partition inference, the
schema compatibility check), without a read. A file without statistics,
or whose statistics cannot give what the table asks (a string bound cut
shorter than the table's truncation length, a column name with a dot), is
described from its footer as before.

The statistics are the producer's word, like the file's content: only their
shape was checked on intake. Its size and MD5 were verified before the first
copy (a mismatch quarantines the sequence before this step runs), so a data
file's size is the verified one.

Blocking; runs in the table step's thread (see :mod:`._catalog`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..events import MAX_BOUND_CHARS, FileStats, decode_bound, published_key, type_params
from ._model import CommitRequest

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.types import PrimitiveType


class DescribedFile(msgspec.Struct, frozen=True, kw_only=True):
    """A published file's size (verified) and the statistics its producer sent."""

    size: int
    stats: FileStats


PARQUET_SUFFIX = ".parquet"


def winner_parquet_files(req: CommitRequest) -> tuple[list[str], dict[str, DescribedFile]]:
    """Return a commit's published Parquet files for a table step, and those described by their producers.

    The files are store keys, by task, named as by plan_commit; the described ones (those whose producer sent
    statistics) map to their verified size and statistics.
    """
    files: list[str] = []
    described: dict[str, DescribedFile] = {}
    for w in sorted(req.winners, key=lambda w: w.task):
        for f in w.files:
            if not f.path.endswith(PARQUET_SUFFIX):
                continue
            key = published_key(req.dataset, req.job, w.task, f.path)
            files.append(key)
            if f.stats is not None:
                described[key] = DescribedFile(size=f.size, stats=f.stats)
    return files, described


def data_files(
    io: FileIO, metadata: TableMetadata, uris: Sequence[str], described: Mapping[str, DescribedFile]
) -> list[DataFile]:
    """Return the data files of ``uris`` in order: from ``described`` where it serves, else from the footer.

    Raises:
        ValueError: a file's schema does not fit the table (pyiceberg's words).
        OSError and the store SDKs' errors: a footer could not be read.
    """
    from pyiceberg.io.pyarrow import parquet_file_to_data_file
    from pyiceberg.utils.concurrent import ExecutorFactory

    built: dict[str, DataFile] = {}
    if described:
        table = _table_view(metadata)
        for uri in uris:
            known = described.get(uri)
            if known is not None:
                df = table.data_file(uri, known.size, known.stats)
                if df is not None:
                    built[uri] = df
    rest = [uri for uri in uris if uri not in built]
    if len(rest) == 1:
        built[rest[0]] = parquet_file_to_data_file(io, metadata, rest[0])
    elif rest:  # in parallel, as add_files reads them
        executor = ExecutorFactory.get_or_create()
        futures = {uri: executor.submit(parquet_file_to_data_file, io, metadata, uri) for uri in rest}
        built.update({uri: f.result() for uri, f in futures.items()})
    return [built[uri] for uri in uris]


def data_file_from_stats(metadata: TableMetadata, uri: str, size: int, stats: FileStats) -> DataFile | None:
    """Return the data file pyiceberg's footer read would give for this file, or None when the stats cannot.

    Raises:
        ValueError: the file's columns do not fit the table's schema (as
            ``parquet_file_to_data_file`` raises it).
    """
    return _table_view(metadata).data_file(uri, size, stats)


_VIEWS_KEPT = 64
_SCHEMAS_KEPT = 64
"""File schemas checked against one table's, kept by its view (a table's jobs share a few)."""
_views: OrderedDict[tuple[Any, ...], _TableView] = OrderedDict()
_views_lock = threading.Lock()


def _table_view(metadata: TableMetadata) -> _TableView:
    """Return the view of ``metadata``'s table, kept by what it is worked out from (the last 64 tables).

    A table's commits share it while its schema, default spec and properties
    stay (the schema check of a job's file schema is then made once, not on
    every commit). Thread-safe.
    """
    key = (
        metadata.table_uuid,
        metadata.current_schema_id,
        metadata.default_spec_id,
        tuple(sorted(metadata.properties.items())),
    )
    with _views_lock:
        found = _views.get(key)
        if found is not None:
            _views.move_to_end(key)
            return found
    view = _TableView(metadata)
    with _views_lock:
        _views[key] = view
        while len(_views) > _VIEWS_KEPT:
            _views.popitem(last=False)
    return view


class _TableView:
    """What describing files to one table needs, worked out once for all of a commit's files.

    The schema, its statistics plan (the metrics mode of each column), and the
    file schemas already checked against the table's (a job's files share
    theirs): pyiceberg works each out again for every file it reads. Kept
    across commits by :func:`_table_view`; thread-safe.
    """

    def __init__(self, metadata: TableMetadata) -> None:
        from pyiceberg.io.pyarrow import compute_statistics_plan

        self.spec_id = metadata.default_spec_id
        self.schema = metadata.schema()
        self.plan = compute_statistics_plan(self.schema, metadata.properties)
        self.spec = metadata.spec()
        # File schemas checked against the table's (a bounded few: a table's jobs share theirs).
        self._checked: OrderedDict[tuple[tuple[str, str, bool], ...], list[Any]] = OrderedDict()
        self._lock = threading.Lock()

    def fields(self, stats: FileStats) -> list[Any]:
        """Return the file's columns as fields of the table's ids. Raises ValueError as pyiceberg does."""
        from pyiceberg.schema import Schema, _check_schema_compatible
        from pyiceberg.types import NestedField

        key = tuple((name, col.type, col.required) for name, col in stats.columns.items())
        with self._lock:
            found = self._checked.get(key)
        if found is not None:
            return found
        fields = []
        extra = []
        for name, col in stats.columns.items():
            try:
                field_id = self.schema.find_field(name, case_sensitive=True).field_id
            except ValueError:
                extra.append(name)
                continue
            fields.append(NestedField(field_id, name, _iceberg_type(col.type), required=col.required))
        if extra:
            raise ValueError(
                f"PyArrow table contains more columns: {', '.join(sorted(extra))}. "
                "Update the schema first (hint, use union_by_name)."
            )
        _check_schema_compatible(self.schema, Schema(*fields))
        with self._lock:
            self._checked[key] = fields
            while len(self._checked) > _SCHEMAS_KEPT:
                self._checked.popitem(last=False)
        return fields

    def data_file(self, uri: str, size: int, stats: FileStats) -> DataFile | None:
        """Return the file's data file, or None when the stats cannot give it (see data_file_from_stats)."""
        from pyiceberg.io.pyarrow import DataFileStatistics, MetricModeTypes, StatsAggregator
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

        if any("." in name for name in stats.columns):
            return None  # a top-level name that reads like a nested path: leave it to the footer
        column_sizes: dict[int, int] = {}
        value_counts: dict[int, int] = {}
        null_counts: dict[int, int] = {}
        aggregates: dict[int, StatsAggregator] = {}
        for f in self.fields(stats):
            col = stats.columns[f.name]
            planned = self.plan[f.field_id]
            column_sizes[f.field_id] = col.size
            if planned.mode.type == MetricModeTypes.NONE:
                continue
            value_counts[f.field_id] = col.values
            if col.nulls is not None:
                null_counts[f.field_id] = col.nulls
            if planned.mode.type == MetricModeTypes.COUNTS or (col.lower is None and col.upper is None):
                continue
            if (col.lower_cut or col.upper_cut) and not _cut_serves(planned.mode.length):
                return None
            agg = StatsAggregator(planned.iceberg_type, _physical(f.field_type), planned.mode.length)
            if col.lower is not None:
                agg.update_min(decode_bound(col.type, col.lower))
            if col.upper is not None:
                agg.update_max(decode_bound(col.type, col.upper))
            aggregates[f.field_id] = agg
        statistics = DataFileStatistics(
            record_count=stats.rows,
            column_sizes=column_sizes,
            value_counts=value_counts,
            null_value_counts=null_counts,
            nan_value_counts={},
            column_aggregates=aggregates,
            split_offsets=list(stats.offsets),
        )
        return DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=uri,
            file_format=FileFormat.PARQUET,
            partition=statistics.partition(self.spec, self.schema),
            file_size_in_bytes=size,
            sort_order_id=None,
            spec_id=self.spec_id,
            equality_ids=None,
            key_metadata=None,
            **statistics.to_serialized_dict(),
        )


def _cut_serves(length: int | None) -> bool:
    """Return True when bounds cut to MAX_BOUND_CHARS give what truncating whole values to ``length`` gives.

    A cut lower bound is the value's first MAX_BOUND_CHARS characters and a cut
    upper one too (not yet incremented): truncated again to fewer characters,
    both come out as the whole value's would. At MAX_BOUND_CHARS or more (or
    no truncation, ``full``), the rest of the value would count.
    """
    return length is not None and length < MAX_BOUND_CHARS


def _iceberg_type(name: str) -> PrimitiveType:
    from pyiceberg.types import (
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        DoubleType,
        FixedType,
        FloatType,
        IntegerType,
        LongType,
        StringType,
        TimestampType,
        TimestamptzType,
        TimeType,
    )

    params = type_params(name)
    if params is None:  # checked on intake; a log written by another version could still hold one
        raise ValueError(f"unknown column type {name!r}")
    kind, a, b = params
    plain: dict[str, Any] = {
        "boolean": BooleanType,
        "int": IntegerType,
        "long": LongType,
        "float": FloatType,
        "double": DoubleType,
        "date": DateType,
        "time": TimeType,
        "timestamp": TimestampType,
        "timestamptz": TimestamptzType,
        "string": StringType,
        "binary": BinaryType,
    }
    if kind == "decimal":
        return DecimalType(a, b)
    if kind == "fixed":
        return FixedType(a)
    result: PrimitiveType = plain[kind]()
    return result


def _physical(t: Any) -> str:
    """Return the Parquet physical type a writer uses for the file's column type ``t``.

    Decimals: fixed-length byte arrays, which the aggregator accepts at any precision.
    """
    from pyiceberg.io.pyarrow import _primitive_to_physical
    from pyiceberg.types import DecimalType

    if isinstance(t, DecimalType):
        return "FIXED_LEN_BYTE_ARRAY"
    return str(_primitive_to_physical(t))


__all__ = ["DescribedFile", "data_file_from_stats", "data_files"]
