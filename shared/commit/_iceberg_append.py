"""A plain append to an Iceberg table, staged without pyiceberg's transaction and snapshot producer.

pyiceberg's ``add_files`` goes through a ``Transaction`` and its fast-append
snapshot producer: the staged metadata worked out again and again, a thread
pool for the one manifest, its pure-Python Avro encoder, and the previous
snapshot's manifests decoded and encoded again into the new manifest list. For the append the table step
makes on most commits (an existing format-version 2 table, fast append,
its name mapping already set), :func:`stage_append` builds the same
snapshot directly:

- one manifest of the job's data files (status ADDED, sequence numbers
  inherited), named and located as pyiceberg names it, written by
  :mod:`._iceberg_manifests` (the same records as pyiceberg's);
- a manifest list of that manifest first, then the parent snapshot's
  manifests that still hold live files (what a fast append keeps), their
  records copied as they were encoded;
- the snapshot (pyiceberg's summary collector and totals, the job's
  properties) and the updates and requirements of pyiceberg's fast append:
  add the snapshot, move ``main`` to it, asserting ``main`` is still the
  parent and the table the same table.

The caller commits them through the catalog as pyiceberg would
(``commit_table``); the result is the table pyiceberg's ``add_files`` gives,
checked field by field against it in ``tests/integration/test_iceberg_append.py``.
Every other case (another format version, manifest merging, a new table,
the first append that sets the name mapping, ``overwrite``) stays on
pyiceberg's path: :func:`applies` says which.

Blocking; runs in the table step's thread (see :mod:`._catalog`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

MAIN_BRANCH = "main"


def applies(metadata: TableMetadata) -> bool:
    """Return True when an append to a table of ``metadata`` can be staged by :func:`stage_append`."""
    from pyiceberg.table import TableProperties
    from pyiceberg.utils.properties import property_as_bool

    if metadata.format_version != 2:
        return False
    if metadata.name_mapping() is None:
        return False  # pyiceberg's path records it (one property change, once per table)
    if property_as_bool(
        metadata.properties,
        TableProperties.MANIFEST_MERGE_ENABLED,
        TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT,
    ):
        return False
    ref = metadata.refs.get(MAIN_BRANCH)
    if ref is None:
        return True
    # A tag named main, or a main whose snapshot is missing: pyiceberg's to refuse, with its reason.
    return ref.snapshot_ref_type.value == "branch" and metadata.snapshot_by_id(ref.snapshot_id) is not None


class StagedAppend:
    """The updates and requirements of one staged append, for ``Catalog.commit_table``."""

    __slots__ = ("requirements", "snapshot_id", "updates")

    def __init__(self, snapshot_id: int, updates: tuple[Any, ...], requirements: tuple[Any, ...]) -> None:
        self.snapshot_id = snapshot_id
        self.updates = updates
        self.requirements = requirements


def stage_append(
    tbl: Table, io: FileIO, files: Sequence[DataFile], properties: Mapping[str, str]
) -> StagedAppend:
    """Write the manifest and manifest list of an append of ``files`` to ``tbl``; return what to commit.

    The two files are written through ``io`` (in the background when it is
    the step's deferring file IO: the caller waits for them before the
    catalog's pointer moves). ``properties`` go into the snapshot's summary.

    Raises:
        ValueError: duplicate paths, or a table :func:`applies` refuses.
        OSError and the store SDKs' errors: reading the parent's manifest list, writing.
    """
    from pyiceberg.table import TableProperties
    from pyiceberg.table.refs import SnapshotRefType
    from pyiceberg.table.snapshots import (
        Operation,
        Snapshot,
        SnapshotSummaryCollector,
        Summary,
        update_snapshot_summaries,
    )
    from pyiceberg.table.update import (
        AddSnapshotUpdate,
        AssertRefSnapshotId,
        AssertTableUUID,
        SetSnapshotRefUpdate,
    )

    from ._iceberg_manifests import write_manifest, write_manifest_list

    md = tbl.metadata
    if not applies(md):
        raise ValueError("this table's append is pyiceberg's to stage")
    paths = [f.file_path for f in files]
    if len(paths) != len(set(paths)):
        raise ValueError("File paths must be unique")
    schema = md.schema()
    spec = md.spec()
    compression: Any = md.properties.get(  # a codec name, checked by the writers
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    )
    snapshot_id = md.new_snapshot_id()
    parent = md.snapshot_by_name(MAIN_BRANCH)
    parent_id = parent.snapshot_id if parent is not None else None
    sequence_number = md.next_sequence_number()
    commit_uuid = uuid.uuid4()
    locations = tbl.location_provider()

    new_manifests = []
    if files:
        out = io.new_output(locations.new_metadata_location(f"{commit_uuid}-m0.avro"))
        new_manifests.append(
            write_manifest(
                out,
                format_version=2,
                spec=spec,
                schema=schema,
                snapshot_id=snapshot_id,
                data_files=files,
                compression=compression,
            )
        )
    list_path = locations.new_metadata_location(f"snap-{snapshot_id}-0-{commit_uuid}.avro")
    write_manifest_list(
        io.new_output(list_path),
        format_version=2,
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        sequence_number=sequence_number,
        new_manifests=new_manifests,
        previous=parent.manifest_list if parent is not None else None,
        io=io,
        compression=compression,
    )

    limit = int(
        md.properties.get(
            TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
            TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
        )
    )
    collector = SnapshotSummaryCollector(partition_summary_limit=limit)
    for df in files:
        collector.add_file(data_file=df, partition_spec=spec, schema=schema)
    summary = update_snapshot_summaries(
        summary=Summary(operation=Operation.APPEND, **collector.build(), **properties),
        previous_summary=parent.summary if parent is not None else None,
    )
    snapshot = Snapshot(  # type: ignore[call-arg]  # pydantic fields by name, as pyiceberg calls it
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_id,
        manifest_list=list_path,
        sequence_number=sequence_number,
        summary=summary,
        schema_id=md.current_schema_id,
    )
    updates = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(  # type: ignore[call-arg]
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent_id,
            ref_name=MAIN_BRANCH,
            type=SnapshotRefType.BRANCH,
        ),
    )
    requirements = (
        AssertRefSnapshotId(snapshot_id=parent_id, ref=MAIN_BRANCH),  # type: ignore[call-arg]
        AssertTableUUID(uuid=md.table_uuid),
    )
    return StagedAppend(snapshot_id, updates, requirements)


__all__ = ["StagedAppend", "applies", "stage_append"]
