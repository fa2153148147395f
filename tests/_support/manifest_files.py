"""Iceberg manifests and manifest lists written by pyiceberg, and data files to put in them.

The reference side of the differential tests (and the benchmark) of
``shared.commit._iceberg_manifests``: pyiceberg's own writers driven as its
fast append drives them, table schemas and partition specs of every
partition type and transform, random data files with statistics (seeded),
and an Avro container parser built on pyiceberg's decoder, not ours.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyiceberg.avro.codecs import KNOWN_CODECS
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.conversions import to_bytes
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    read_manifest_list,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    IdentityTransform,
    TruncateTransform,
)
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

DATA_FILE_FIELDS = (
    "content",
    "file_path",
    "file_format",
    "partition",
    "record_count",
    "file_size_in_bytes",
    "column_sizes",
    "value_counts",
    "null_value_counts",
    "nan_value_counts",
    "lower_bounds",
    "upper_bounds",
    "key_metadata",
    "split_offsets",
    "equality_ids",
    "sort_order_id",
    "spec_id",
)
"""A data file's fields as pyiceberg names them (what two data files of the same file must agree on)."""


def data_file_fields(df: Any) -> dict[str, Any]:
    """Return ``df``'s :data:`DATA_FILE_FIELDS` by name (None where it has no such field)."""
    return {name: getattr(df, name, None) for name in DATA_FILE_FIELDS}


WIDE_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "n", IntegerType(), required=False),
    NestedField(3, "name", StringType(), required=False),
    NestedField(4, "day", DateType(), required=False),
    NestedField(5, "flag", BooleanType(), required=False),
    NestedField(6, "ts", TimestampType(), required=False),
    NestedField(7, "amount", DecimalType(12, 2), required=False),
    NestedField(8, "ratio", DoubleType(), required=False),
    NestedField(9, "score", FloatType(), required=False),
    NestedField(10, "tstz", TimestamptzType(), required=False),
    NestedField(11, "blob", BinaryType(), required=False),
    NestedField(12, "uid", UUIDType(), required=False),
)
"""A table of 12 columns, one of each type a partition or a bound can hold."""


def spec_of(*fields: tuple[int, Any, str]) -> PartitionSpec:
    """Return the partition spec of ``(source column id, transform, name)`` fields, ids from 1000."""
    return PartitionSpec(
        *(
            PartitionField(source_id=src, field_id=1000 + i, transform=t, name=name)
            for i, (src, t, name) in enumerate(fields)
        )
    )


SPECS: dict[str, PartitionSpec] = {
    "unpartitioned": PartitionSpec(),
    "identity-int": spec_of((2, IdentityTransform(), "n")),
    "identity-long": spec_of((1, IdentityTransform(), "id")),
    "identity-string": spec_of((3, IdentityTransform(), "name")),
    "identity-date": spec_of((4, IdentityTransform(), "day")),
    "identity-boolean": spec_of((5, IdentityTransform(), "flag")),
    "identity-timestamp": spec_of((6, IdentityTransform(), "ts")),
    "identity-decimal": spec_of((7, IdentityTransform(), "amount")),
    "identity-uuid": spec_of((12, IdentityTransform(), "uid")),
    "bucket-truncate-day": spec_of(
        (1, BucketTransform(16), "id_bucket"),
        (3, TruncateTransform(4), "name_trunc"),
        (6, DayTransform(), "ts_day"),
    ),
    "all-identity": spec_of(
        (2, IdentityTransform(), "n"),
        (3, IdentityTransform(), "name"),
        (4, IdentityTransform(), "day"),
        (5, IdentityTransform(), "flag"),
        (7, IdentityTransform(), "amount"),
    ),
}
"""Partition specs over :data:`WIDE_SCHEMA`, by name."""


def random_value(t: PrimitiveType, rng: random.Random) -> Any:
    """Return a random Python value of Iceberg type ``t`` as pyiceberg holds it (a date as days, etc.)."""
    if isinstance(t, BooleanType):
        return rng.random() < 0.5
    if isinstance(t, IntegerType):
        return rng.randint(-(2**31), 2**31 - 1)
    if isinstance(t, LongType):
        return rng.choice([rng.randint(-(2**63), 2**63 - 1), rng.randint(-100, 100)])
    if isinstance(t, StringType):
        return "".join(rng.choice("abcé☃xyz0123") for _ in range(rng.randint(0, 12)))
    if isinstance(t, DateType):
        return rng.randint(-30000, 30000)
    if isinstance(t, TimestampType | TimestamptzType):
        return rng.randint(-(2**50), 2**50)
    if isinstance(t, DecimalType):
        return Decimal(rng.randint(-(10**t.precision) + 1, 10**t.precision - 1)).scaleb(-t.scale)
    if isinstance(t, DoubleType | FloatType):
        return rng.choice([rng.uniform(-1e6, 1e6), 0.0, -0.5])
    if isinstance(t, BinaryType):
        return rng.randbytes(rng.randint(0, 16))
    if isinstance(t, UUIDType):
        return uuid.UUID(bytes=rng.randbytes(16))
    raise AssertionError(f"no random value for {t}")


def partition_values(spec: PartitionSpec, schema: Schema, rng: random.Random, null_rate: float) -> Record:
    """Return a random partition tuple of ``spec`` (each value null at ``null_rate``)."""
    types = [f.field_type for f in spec.partition_type(schema).fields]
    values: list[Any] = []
    for t in types:
        assert isinstance(t, PrimitiveType)
        if rng.random() < null_rate:
            values.append(None)
        elif isinstance(t, DateType):
            values.append(rng.randint(0, 20000))
        elif isinstance(t, UUIDType):
            values.append(uuid.UUID(bytes=rng.randbytes(16)))
        else:
            values.append(random_value(t, rng))
    return Record(*values)


@dataclass(frozen=True)
class FileShape:
    """What a random data file carries: which statistics, how many columns of them."""

    columns: int = 10
    stats: bool = True
    bounds: bool = True
    nan_counts: bool = True
    split_offsets: bool = True
    key_metadata: bool = False
    sort_order: bool = False
    null_rate: float = 0.1


def random_data_file(
    i: int, schema: Schema, spec: PartitionSpec, rng: random.Random, shape: FileShape = FileShape()
) -> DataFile:
    """Return a random Parquet ``DataFile`` number ``i``, with statistics of the first ``shape.columns``."""
    cols = schema.columns[: shape.columns]
    bound_cols = [c for c in cols if isinstance(c.field_type, PrimitiveType)]

    def counts(hi: int) -> dict[int, int]:
        return {c.field_id: rng.randint(0, hi) for c in cols} if shape.stats else {}

    def bounds() -> dict[int, bytes]:
        if not shape.bounds:
            return {}
        return {c.field_id: to_bytes(c.field_type, random_value(c.field_type, rng)) for c in bound_cols}

    nan_cols = [c for c in cols if isinstance(c.field_type, DoubleType | FloatType)]
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f"s3://bucket/table/data/part-{i:05d}-{uuid.UUID(bytes=rng.randbytes(16))}.parquet",
        file_format=FileFormat.PARQUET,
        partition=partition_values(spec, schema, rng, shape.null_rate),
        record_count=rng.randint(0, 10**7),
        file_size_in_bytes=rng.randint(100, 2**40),
        column_sizes=counts(2**34),
        value_counts=counts(10**7),
        null_value_counts=counts(10**5),
        nan_value_counts={c.field_id: rng.randint(0, 9) for c in nan_cols} if shape.nan_counts else {},
        lower_bounds=bounds(),
        upper_bounds=bounds(),
        key_metadata=rng.randbytes(8) if shape.key_metadata else None,
        split_offsets=sorted(rng.randint(4, 2**30) for _ in range(rng.randint(1, 4)))
        if shape.split_offsets
        else None,
        equality_ids=None,
        sort_order_id=rng.choice([None, 0, 1]) if shape.sort_order else None,
        spec_id=spec.spec_id,
    )


def pyiceberg_manifest(
    io: FileIO,
    path: str,
    *,
    format_version: int,
    spec: PartitionSpec,
    schema: Schema,
    snapshot_id: int,
    data_files: Sequence[DataFile],
    compression: str,
) -> ManifestFile:
    """Write a manifest of ``data_files`` as pyiceberg's fast append does; return its ``ManifestFile``."""
    with write_manifest(
        format_version, spec, schema, io.new_output(path), snapshot_id, compression
    ) as writer:  # type: ignore[arg-type]
        for df in data_files:
            writer.add(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot_id,
                    sequence_number=None,
                    file_sequence_number=None,
                    data_file=df,
                )
            )
    return writer.to_manifest_file()


def pyiceberg_manifest_list(
    io: FileIO,
    path: str,
    *,
    format_version: int,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int | None,
    new_manifests: Sequence[ManifestFile],
    previous: str | None,
    compression: str,
) -> None:
    """Write a manifest list as pyiceberg's fast append does: the new manifests, then the live previous."""
    existing: list[ManifestFile] = []
    if previous is not None:
        for m in read_manifest_list(io.new_input(previous)):
            if m.has_added_files() or m.has_existing_files() or m.added_snapshot_id == snapshot_id:
                existing.append(m)
    with write_manifest_list(
        format_version,  # type: ignore[arg-type]
        io.new_output(path),
        snapshot_id,
        parent_snapshot_id,
        sequence_number,
        compression,  # type: ignore[arg-type]
    ) as writer:
        writer.add_manifests([*new_manifests, *existing])


@dataclass(frozen=True)
class Container:
    """An Avro object container file taken apart (pyiceberg's decoder and codecs)."""

    head: bytes
    """The header up to its sync marker (magic and metadata, as encoded)."""
    meta: list[tuple[str, bytes]]
    sync: bytes
    count: int
    """Records in all blocks."""
    records: bytes
    """Every block's records, decompressed and concatenated."""
    blocks: int


def parse_container(data: bytes) -> Container:
    """Return the container file ``data`` taken apart; checks every block's sync marker."""
    dec = new_decoder(data)
    assert dec.read(4) == b"Obj\x01"
    meta: list[tuple[str, bytes]] = []
    while n := dec.read_int():
        if n < 0:
            dec.read_int()  # a block of negative count carries its size in bytes
        for _ in range(abs(n)):
            key = dec.read_utf8()
            meta.append((key, dec.read_bytes()))
    head_end = dec.tell()
    sync = dec.read(16)
    codec_name = dict(meta).get("avro.codec", b"null").decode()
    codec = KNOWN_CODECS[codec_name]  # type: ignore[index]
    count = 0
    blocks = 0
    records = bytearray()
    while dec.tell() < len(data):
        count += dec.read_int()
        payload = dec.read_bytes()
        records += codec.decompress(payload) if codec is not None else payload
        assert dec.read(16) == sync, "a block without the file's sync marker"
        blocks += 1
    return Container(data[:head_end], meta, sync, count, bytes(records), blocks)


def manifest_file_fields(m: ManifestFile) -> dict[str, Any]:
    """Return a ``ManifestFile``'s every field by name (pyiceberg's equality compares only the path)."""
    names = [
        "manifest_path",
        "manifest_length",
        "partition_spec_id",
        "content",
        "sequence_number",
        "min_sequence_number",
        "added_snapshot_id",
        "added_files_count",
        "existing_files_count",
        "deleted_files_count",
        "added_rows_count",
        "existing_rows_count",
        "deleted_rows_count",
        "partitions",
        "key_metadata",
    ]
    return {n: getattr(m, n) for n in names}
