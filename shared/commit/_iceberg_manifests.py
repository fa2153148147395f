"""An append's Iceberg manifest and manifest list, written with our Avro encoder instead of pyiceberg's.

The same files, field for field, as pyiceberg's fast append writes them
(``_SnapshotProducer._manifests`` and ``_commit``):

- :func:`write_manifest`: one manifest of ADDED entries for the given data
  files, as ``write_manifest(...)`` + ``writer.add(ManifestEntry(ADDED, ...))``
  + ``to_manifest_file()``: the same Avro schema (pyiceberg's own conversion
  of its manifest entry schema for the spec's partition type), the same header
  metadata, the same returned ``ManifestFile``;
- :func:`write_manifest_list`: the new manifests first (their unassigned
  sequence numbers set to the commit's), then the previous snapshot's live
  ones (those with added or existing files, as the fast append keeps).

pyiceberg encodes every value through a tree of writer objects, and the
fast append decodes the previous manifest list into objects only to encode
them again. Here a schema compiles once into closures (:mod:`._avro_writer`),
and the previous list's records are copied as they are, block by block,
when its schema is the one written: each record is only walked to find its
end and read its file counts (:mod:`._avro_reader`). A previous list of
another schema (another format version, another writer's schema) is decoded
with pyiceberg and encoded again. The previous list is held once, and the
new one is written a block at a time.

Differences from pyiceberg's bytes, none visible to a reader: entries are
written many to a block (pyiceberg writes a block per manifest entry), and a
``deflate`` block is raw deflate as the Avro specification says (pyiceberg
leaves three bytes of zlib's checksum after it, which readers ignore).

Format versions 1 and 2 (pyiceberg 0.12 writes no other). A version, codec
or schema this module cannot write is a ``ValueError`` before anything is
written, so that a caller can use pyiceberg's writers instead.

Imports pyiceberg: loaded only when a table is written.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from operator import attrgetter
from typing import Any, Final, NamedTuple

from pydantic_core import to_json
from pyiceberg.avro.codecs import CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.exceptions import ValidationError
from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile
from pyiceberg.manifest import (
    DEFAULT_BLOCK_SIZE,
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    ManifestContent,
    ManifestEntryStatus,
    ManifestFile,
    construct_partition_summaries,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
    read_manifest_list,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import StructType
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from ._avro_codecs import codec
from ._avro_reader import compile_scanner, iter_blocks, read_header, split_records
from ._avro_writer import AvroContainerWriter
from ._sized_cache import SizedCache

SUPPORTED_FORMAT_VERSIONS: Final = (1, 2)
_ADDED: Final = int(ManifestEntryStatus.ADDED)

# The data file's fields as each format version's manifest writes them, read from a DataFile by name
# (v1's block_size_in_bytes is not on a DataFile: pyiceberg writes its default).
_DATA_FILE_V2: Final = (
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
)
_DATA_FILE_V1: Final = (
    "file_path",
    "file_format",
    "partition",
    "record_count",
    "file_size_in_bytes",
    "block_size_in_bytes",
    "column_sizes",
    "value_counts",
    "null_value_counts",
    "nan_value_counts",
    "lower_bounds",
    "upper_bounds",
    "key_metadata",
    "split_offsets",
    "sort_order_id",
)
_ENTRY: Final = {1: ("status", "snapshot_id", "data_file"), 2: ("status", "snapshot_id", "sequence_number",
                 "file_sequence_number", "data_file")}  # fmt: skip
_GET_V2: Final = attrgetter(*_DATA_FILE_V2)
_GET_V1: Final = attrgetter(*(n for n in _DATA_FILE_V1 if n != "block_size_in_bytes"))
_COUNTS: Final = ("added_snapshot_id", "added_files_count", "existing_files_count")
_SEQUENCES: Final = ("sequence_number", "min_sequence_number")


class ManifestListWritten(NamedTuple):
    """What :func:`write_manifest_list` wrote."""

    length: int
    """The file's size in bytes."""
    manifests: int
    """The manifests listed: the new ones, then the previous snapshot's kept."""
    copied: bool
    """Whether the previous list's records were copied as encoded (else decoded and encoded again)."""


def _check_version(format_version: int) -> None:
    if format_version not in SUPPORTED_FORMAT_VERSIONS:
        raise ValueError(f"cannot write Iceberg manifests of format version {format_version}")


def avro_codec(compression: str) -> str:
    """Return the Avro codec pyiceberg writes for a ``write.avro.compression-codec`` value (gzip: deflate)."""
    return CODEC_MAPPING_ICEBERG_TO_AVRO.get(compression, compression)


def _field_names(schema_json: str, path: Sequence[str]) -> list[str]:
    node: Any = json.loads(schema_json)
    for name in path:
        field = next(f for f in node["fields"] if f["name"] == name)
        node = field["type"]
    return [str(f["name"]) for f in node["fields"]]


@lru_cache(maxsize=64)
def _manifest_schema_json(format_version: int, partition_type: StructType) -> str:
    """Return the Avro schema pyiceberg writes in a manifest of ``partition_type``, checked against ours.

    Raises:
        ValueError: pyiceberg's manifest entry schema is not the one this module lays its records out for.
    """
    file_schema = manifest_entry_schema_with_data_file(
        format_version=format_version,  # type: ignore[arg-type]
        data_file=data_file_with_partition(partition_type, format_version),  # type: ignore[arg-type]
    )
    text = json.dumps(AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name="manifest_entry"))
    expected = _DATA_FILE_V2 if format_version == 2 else _DATA_FILE_V1
    if _field_names(text, ()) != list(_ENTRY[format_version]) or _field_names(text, ("data_file",)) != list(
        expected
    ):
        raise ValueError(f"pyiceberg's v{format_version} manifest entry schema is not the one expected")
    return text


@lru_cache(maxsize=4)
def _list_schema_json(format_version: int) -> str:
    """Return the Avro schema pyiceberg writes in a manifest list of ``format_version``."""
    schema = MANIFEST_LIST_FILE_SCHEMAS[format_version]
    return json.dumps(AvroSchemaConversion().iceberg_to_avro(schema, schema_name="manifest_file"))


def _list_fields(format_version: int) -> attrgetter[Any]:
    return attrgetter(*(f.name for f in MANIFEST_LIST_FILE_SCHEMAS[format_version].fields))


def _write_out(output_file: OutputFile, chunks: Iterable[bytes]) -> None:
    stream = output_file.create(overwrite=True)
    try:
        for chunk in chunks:
            stream.write(chunk)
    finally:
        stream.close()


def write_manifest(
    output_file: OutputFile,
    *,
    format_version: int,
    spec: PartitionSpec,
    schema: Schema,
    snapshot_id: int,
    data_files: Sequence[DataFile],
    compression: str,
) -> ManifestFile:
    """Write a manifest of ``data_files``, all ADDED by ``snapshot_id``; return its ``ManifestFile``.

    As pyiceberg's fast append: ``compression`` is the table's
    ``write.avro.compression-codec`` value; the returned ``ManifestFile``'s
    sequence numbers are unassigned (the manifest list sets them).

    Raises:
        ValueError: no data files, or a format version, codec or schema not supported (nothing written).
        TypeError, ValueError: a data file's value does not fit its type (the file may be left partial).
    """
    _check_version(format_version)
    if not data_files:
        raise ValueError("an empty manifest file has been written")
    partition_type = spec.partition_type(schema)
    schema_json = _manifest_schema_json(format_version, partition_type)
    meta = {
        "schema": schema.model_dump_json(),
        "partition-spec": to_json(spec.fields).decode("utf-8"),
        "partition-spec-id": str(spec.spec_id),
        "format-version": str(format_version),
        "avro.codec": compression,
    }
    if format_version == 2:
        meta["content"] = "data"
    chunks: list[bytes] = []
    writer = AvroContainerWriter(
        chunks.append, schema_json, codec_name=avro_codec(compression), metadata=meta
    )
    added_rows = 0
    for df in data_files:
        if format_version == 2:
            writer.append((_ADDED, snapshot_id, None, None, _GET_V2(df)))
        else:
            v = _GET_V1(df)
            writer.append((_ADDED, snapshot_id, (*v[:5], DEFAULT_BLOCK_SIZE, *v[5:])))
        added_rows += df.record_count
    length = writer.close()
    _write_out(output_file, chunks)
    return ManifestFile.from_args(
        manifest_path=output_file.location,
        manifest_length=length,
        partition_spec_id=spec.spec_id,
        content=ManifestContent.DATA,
        sequence_number=UNASSIGNED_SEQ,
        min_sequence_number=UNASSIGNED_SEQ,
        added_snapshot_id=snapshot_id,
        added_files_count=len(data_files),
        existing_files_count=0,
        deleted_files_count=0,
        added_rows_count=added_rows,
        existing_rows_count=0,
        deleted_rows_count=0,
        partitions=construct_partition_summaries(spec, schema, [df.partition for df in data_files]),
        key_metadata=None,
    )


def _kept(added_snapshot_id: int | None, added: int | None, existing: int | None, snapshot_id: int) -> bool:
    """Return whether the fast append keeps a previous manifest (it has live files, or is this commit's)."""
    return added is None or added > 0 or existing is None or existing > 0 or added_snapshot_id == snapshot_id


class _Prepare:
    """A manifest as the list writer of a format version lays it out (pyiceberg's ``prepare_manifest``)."""

    def __init__(self, format_version: int, snapshot_id: int, sequence_number: int | None) -> None:
        self._v2 = format_version == 2
        self._snapshot_id = snapshot_id
        self._sequence_number = sequence_number
        self._fields = _list_fields(format_version)

    def __call__(self, m: ManifestFile) -> Any:
        """Return ``m``'s record values.

        Raises:
            ValueError: an unassigned sequence number on a manifest of another snapshot (v2).
            ValidationError: a delete manifest in a v1 list.
        """
        values = self._fields(m)
        if not self._v2:
            if m.content != ManifestContent.DATA:
                raise ValidationError("Cannot store delete manifests in a v1 table")
            return values
        seq, min_seq = m.sequence_number, m.min_sequence_number
        if seq != UNASSIGNED_SEQ and min_seq != UNASSIGNED_SEQ:
            return values
        if self._snapshot_id != m.added_snapshot_id:
            raise ValueError(
                f"Found unassigned sequence number for a manifest from snapshot: "
                f"{self._snapshot_id} != {m.added_snapshot_id}"
            )
        row = list(values)
        # sequence_number and min_sequence_number: the 5th and 6th fields of v2's list schema.
        if seq == UNASSIGNED_SEQ:
            row[4] = self._sequence_number
        if min_seq == UNASSIGNED_SEQ:
            row[5] = self._sequence_number
        return row


class _BytesInput(InputFile):
    """A file already in memory, for pyiceberg's reader."""

    def __init__(self, location: str, data: bytes) -> None:
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> InputStream:
        return io.BytesIO(self._data)


MAX_LISTED_BYTES: Final = 32 * 1024 * 1024
"""Records of the manifest lists this process wrote, kept for the next append (uncompressed bytes, in all)."""
MAX_LISTED_LIST_BYTES: Final = 8 * 1024 * 1024


_LISTED: SizedCache[tuple[str, bytes, int]] = SizedCache(MAX_LISTED_BYTES, MAX_LISTED_LIST_BYTES)
"""The records of the manifest lists this process wrote, by location: (schema, records, count).

Every record of a list written here is one the next fast append keeps
(a manifest with added or existing files: :func:`_kept`; a manifest's
counts never change), so the next list of the same table is the new
manifests' records followed by these bytes as they are: no read, no walk
of the previous list. A manifest list is never changed once written (the
Iceberg spec), so its records by location stay right.
"""


def _read_previous(previous: str | bytes, io_: FileIO) -> tuple[str, bytes]:
    if isinstance(previous, bytes):
        return "<previous manifest list>", previous
    with io_.new_input(previous).open() as f:
        return previous, f.read()


def _copy_previous(
    writer: AvroContainerWriter, data: bytes, schema_json: str, v2: bool, snapshot_id: int
) -> bool:
    """Copy the kept records of a previous list into ``writer`` as they are encoded; return whether it could.

    It cannot (False: the writer then holds part of them and is to be
    dropped) when the list's schema is not the one written, its codec is not
    one we read, or a record's sequence numbers are unassigned (pyiceberg
    never writes those, and assigns or refuses them: the decode path does).
    One block of the previous list is decompressed at a time.

    Raises:
        ValueError: the previous list is malformed.
    """
    header = read_header(data)
    theirs = header.schema_json
    if theirs != schema_json and json.loads(theirs) != json.loads(schema_json):
        return False
    try:
        codec(header.codec_name)
    except ValueError:
        return False
    scan = compile_scanner(schema_json, _COUNTS + _SEQUENCES if v2 else _COUNTS)
    for block in iter_blocks(data, header):
        keep: list[tuple[int, int]] = []
        for start, end, values in split_records(block.data, block.entries, scan):
            if v2 and UNASSIGNED_SEQ in values[3:]:
                return False
            if _kept(values[0], values[1], values[2], snapshot_id):
                keep.append((start, end))
        if len(keep) == block.entries:
            writer.append_encoded(block.data, block.entries)
        else:
            view = memoryview(block.data)
            for start, end in keep:
                writer.append_encoded(view[start:end], 1)
    return True


def write_manifest_list(
    output_file: OutputFile,
    *,
    format_version: int,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int | None,
    new_manifests: Sequence[ManifestFile],
    previous: str | bytes | None,
    io: FileIO,
    compression: str,
) -> ManifestListWritten:
    """Write a fast append's manifest list: ``new_manifests``, then the kept manifests of ``previous``.

    ``previous`` is the parent snapshot's manifest list (its location, read
    through ``io``, or its bytes), or None for a first snapshot. Its records
    are copied as encoded when its Avro schema is the one written, else
    decoded with pyiceberg and encoded again.

    Raises:
        ValueError: a format version, codec or schema not supported, or a v2 list without a sequence number
            (nothing written); an unassigned sequence number on another snapshot's manifest.
        ValidationError: a delete manifest in a v1 list.
    """
    _check_version(format_version)
    if format_version == 2 and sequence_number is None:
        raise ValueError(f"Sequence-number is required for V2 tables: {sequence_number}")
    meta = {"snapshot-id": str(snapshot_id), "parent-snapshot-id": str(parent_snapshot_id)}
    if parent_snapshot_id is None:
        meta["parent-snapshot-id"] = "null"
    if format_version == 2:
        meta["sequence-number"] = str(sequence_number)
    meta["format-version"] = str(format_version)
    meta["avro.codec"] = compression
    schema_json = _list_schema_json(format_version)
    prepare = _Prepare(format_version, snapshot_id, sequence_number)
    new_rows = [prepare(m) for m in new_manifests]

    # The file is built in memory and written at the end: a failure leaves nothing behind, and a previous
    # list that cannot be copied as it is starts the file again on the decode path.
    def start() -> tuple[list[bytes], AvroContainerWriter]:
        chunks: list[bytes] = []
        writer = AvroContainerWriter(
            chunks.append, schema_json, codec_name=avro_codec(compression), metadata=meta
        )
        writer.tap = bytearray()
        for row in new_rows:
            writer.append(row)
        return chunks, writer

    chunks, writer = start()
    # A list this process wrote: its records, all kept again by an append (see _LISTED), as encoded.
    listed = _LISTED.get(previous) if isinstance(previous, str) else None
    if listed is not None and listed[0] != schema_json:
        listed = None
    copied = listed is not None
    if listed is not None:
        writer.append_encoded(listed[1], listed[2])
    elif previous is not None:
        location, data = _read_previous(previous, io)
        copied = _copy_previous(writer, data, schema_json, format_version == 2, snapshot_id)
        if not copied:
            chunks, writer = start()
            for m in read_manifest_list(_BytesInput(location, data)):
                if _kept(m.added_snapshot_id, m.added_files_count, m.existing_files_count, snapshot_id):
                    writer.append(prepare(m))
    length = writer.close()
    _write_out(output_file, chunks)
    if writer.tap is not None and all(
        _kept(None, m.added_files_count, m.existing_files_count, 0) for m in new_manifests
    ):
        records = bytes(writer.tap)
        _LISTED.put(output_file.location, (schema_json, records, writer.records), len(records))
    return ManifestListWritten(length=length, manifests=writer.records, copied=copied)
