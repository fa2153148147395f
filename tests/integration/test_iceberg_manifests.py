"""Our manifest and manifest list writers against pyiceberg's: the same inputs, the same files (differential).

Each case writes with pyiceberg's writers (driven as its fast append drives
them) and with ours, then compares: the records of both files byte for byte
(every block decompressed, blocks concatenated: ours puts many records in a
block), their headers byte for byte up to the sync marker (the metadata
keys, values and order), what pyiceberg reads back from both (entries, the
manifest list), and the returned ``ManifestFile``. Local files in tmp_path.
"""

from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.exceptions import ValidationError
from pyiceberg.io.pyarrow import PyArrowFileIO, parquet_file_to_data_file
from pyiceberg.manifest import (
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestFile,
    construct_partition_summaries,
    read_manifest_list,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import TableProperties

from shared.commit._avro_writer import AvroContainerWriter
from shared.commit._iceberg_manifests import (
    ManifestListWritten,
    _list_schema_json,
    write_manifest,
    write_manifest_list,
)
from tests._support.manifest_files import (
    SPECS,
    WIDE_SCHEMA,
    FileShape,
    data_file_fields,
    manifest_file_fields,
    parse_container,
    pyiceberg_manifest,
    pyiceberg_manifest_list,
    random_data_file,
)

IO = PyArrowFileIO()
SNAP = 8_765_432_101_234


def _entry_fields(e: ManifestEntry) -> dict[str, Any]:
    df = e.data_file
    return {
        "status": e.status,
        "snapshot_id": e.snapshot_id,
        "sequence_number": e.sequence_number,
        "file_sequence_number": e.file_sequence_number,
        **data_file_fields(df),
    }


def _header(path: str) -> dict[str, str]:
    with AvroFile[Any](IO.new_input(path)) as f:
        return dict(f.header.meta)


def assert_same_files(ours: str, theirs: str) -> None:
    """The two container files hold the same header (up to the sync marker) and the same records."""
    a, b = parse_container(Path(ours).read_bytes()), parse_container(Path(theirs).read_bytes())
    assert a.meta == b.meta
    assert a.head == b.head
    assert a.count == b.count
    assert a.records == b.records
    assert _header(ours) == _header(theirs)


def assert_same_manifest(ours: ManifestFile, theirs: ManifestFile) -> None:
    """Same files, same ManifestFile (but the path, and a length that is our file's), same entries read."""
    assert_same_files(ours.manifest_path, theirs.manifest_path)
    mine, ref = manifest_file_fields(ours), manifest_file_fields(theirs)
    assert mine.pop("manifest_length") == os.path.getsize(ours.manifest_path)
    del ref["manifest_length"]
    mine.pop("manifest_path")
    ref.pop("manifest_path")
    assert mine == ref
    # Read back as a listed manifest is read: sequence numbers inherited from its list.
    for m in (ours, theirs):
        m.sequence_number = m.min_sequence_number = 5
    got = [_entry_fields(e) for e in ours.fetch_manifest_entry(IO)]
    want = [_entry_fields(e) for e in theirs.fetch_manifest_entry(IO)]
    assert got == want
    assert len(got) == ours.added_files_count
    for m in (ours, theirs):
        m.sequence_number = m.min_sequence_number = UNASSIGNED_SEQ


def both_manifests(
    tmp: Path,
    files: list[DataFile],
    *,
    spec: PartitionSpec,
    version: int = 2,
    compression: str = "gzip",
    snapshot_id: int = SNAP,
    schema: Schema = WIDE_SCHEMA,
    name: str = "m",
) -> tuple[ManifestFile, ManifestFile]:
    args: dict[str, Any] = {
        "format_version": version,
        "spec": spec,
        "schema": schema,
        "snapshot_id": snapshot_id,
        "data_files": files,
        "compression": compression,
    }
    theirs = pyiceberg_manifest(IO, f"{tmp}/{name}-theirs.avro", **args)
    ours = write_manifest(IO.new_output(f"{tmp}/{name}-ours.avro"), **args)
    return ours, theirs


def files_of(spec: PartitionSpec, n: int, seed: int, shape: FileShape | None = None) -> list[DataFile]:
    rng = random.Random(seed)
    return [random_data_file(i, WIDE_SCHEMA, spec, rng, shape or FileShape()) for i in range(n)]


# -- manifests ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_manifest_equals_pyiceberg_for_every_partition_kind(
    tmp_path: Path, spec_name: str, version: int
) -> None:
    spec = SPECS[spec_name]
    files = files_of(spec, 6, seed=hash(spec_name) % 1000, shape=FileShape(null_rate=0.3))
    ours, theirs = both_manifests(tmp_path, files, spec=spec, version=version)
    assert_same_manifest(ours, theirs)


@pytest.mark.parametrize(
    "shape",
    [
        FileShape(stats=False, bounds=False, nan_counts=False, split_offsets=False),  # empty maps, no offsets
        FileShape(null_rate=1.0),  # every partition value null
        FileShape(columns=12, key_metadata=True, sort_order=True),  # every column, every optional field set
        FileShape(columns=1, bounds=False),
    ],
    ids=["empty-stats", "null-partitions", "everything", "one-column"],
)
@pytest.mark.parametrize("version", [1, 2])
def test_manifest_equals_pyiceberg_for_every_file_shape(
    tmp_path: Path, shape: FileShape, version: int
) -> None:
    spec = SPECS["all-identity"]
    ours, theirs = both_manifests(
        tmp_path, files_of(spec, 5, seed=3, shape=shape), spec=spec, version=version
    )
    assert_same_manifest(ours, theirs)


@pytest.mark.parametrize(
    ("compression", "codec"),
    [
        ("null", "null"),
        ("gzip", "deflate"),
        ("deflate", "deflate"),
        ("zstd", "zstandard"),
        ("bzip2", "bzip2"),
    ],
)
def test_manifest_codecs(tmp_path: Path, compression: str, codec: str) -> None:
    spec = SPECS["identity-date"]
    ours, theirs = both_manifests(tmp_path, files_of(spec, 4, seed=1), spec=spec, compression=compression)
    assert_same_manifest(ours, theirs)
    assert _header(ours.manifest_path)["avro.codec"] == codec


def test_default_codec_is_gzip_written_as_deflate(tmp_path: Path) -> None:
    """The table property's default is gzip, which both write as Avro's deflate (raw, readable by zlib)."""
    assert TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT == "gzip"
    spec = SPECS["unpartitioned"]
    compression = TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
    ours, theirs = both_manifests(tmp_path, files_of(spec, 2, seed=2), spec=spec, compression=compression)
    assert_same_manifest(ours, theirs)
    assert _header(ours.manifest_path)["avro.codec"] == "deflate"
    assert _header(theirs.manifest_path)["avro.codec"] == "deflate"


def test_a_thousand_files_in_one_manifest(tmp_path: Path) -> None:
    spec = SPECS["bucket-truncate-day"]
    ours, theirs = both_manifests(tmp_path, files_of(spec, 1000, seed=4), spec=spec)
    assert_same_manifest(ours, theirs)
    assert ours.added_files_count == 1000
    assert parse_container(Path(ours.manifest_path).read_bytes()).blocks > 1  # bounded blocks


def test_manifest_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    spec = SPECS["unpartitioned"]
    files = files_of(spec, 1, seed=5)
    out = f"{tmp_path}/x.avro"
    args: dict[str, Any] = {"spec": spec, "schema": WIDE_SCHEMA, "snapshot_id": 1, "data_files": files}
    with pytest.raises(ValueError, match="format version 3"):
        write_manifest(IO.new_output(out), format_version=3, compression="gzip", **args)
    with pytest.raises(ValueError, match="codec"):
        write_manifest(IO.new_output(out), format_version=2, compression="lz4", **args)
    with pytest.raises(ValueError, match="empty"):
        write_manifest(IO.new_output(out), format_version=2, compression="gzip", **{**args, "data_files": []})
    assert not os.path.exists(out)


def test_fuzz_manifests(tmp_path: Path) -> None:
    """Random specs, file shapes, versions and codecs (seeded): both writers, read back, equal."""
    rng = random.Random(20240611)
    for i in range(40):
        spec = SPECS[rng.choice(sorted(SPECS))]
        shape = FileShape(
            columns=rng.randint(0, 12),
            stats=rng.random() < 0.8,
            bounds=rng.random() < 0.7,
            nan_counts=rng.random() < 0.5,
            split_offsets=rng.random() < 0.5,
            key_metadata=rng.random() < 0.2,
            sort_order=rng.random() < 0.3,
            null_rate=rng.choice([0.0, 0.2, 1.0]),
        )
        files = [random_data_file(j, WIDE_SCHEMA, spec, rng, shape) for j in range(rng.randint(1, 12))]
        ours, theirs = both_manifests(
            tmp_path,
            files,
            spec=spec,
            version=rng.choice([1, 2]),
            compression=rng.choice(["null", "gzip", "zstd"]),
            snapshot_id=rng.randint(1, 2**63 - 1),
            name=f"f{i}",
        )
        assert_same_manifest(ours, theirs)


# -- manifest lists -----------------------------------------------------------------------------------------


def manifest_of(snapshot_id: int, seq: int = UNASSIGNED_SEQ, **counts: Any) -> ManifestFile:
    """A listed manifest's record (the file itself is not read by a list writer)."""
    rng = random.Random(snapshot_id)
    spec = SPECS["identity-date"]
    files = [random_data_file(i, WIDE_SCHEMA, spec, rng) for i in range(rng.randint(1, 3))]
    values: dict[str, Any] = {
        "manifest_path": f"s3://bucket/table/metadata/{snapshot_id}-m0.avro",
        "manifest_length": rng.randint(1000, 10**6),
        "partition_spec_id": 0,
        "content": ManifestContent.DATA,
        "sequence_number": seq,
        "min_sequence_number": seq,
        "added_snapshot_id": snapshot_id,
        "added_files_count": len(files),
        "existing_files_count": 0,
        "deleted_files_count": 0,
        "added_rows_count": sum(f.record_count for f in files),
        "existing_rows_count": 0,
        "deleted_rows_count": 0,
        "partitions": construct_partition_summaries(spec, WIDE_SCHEMA, [f.partition for f in files]),
        "key_metadata": None,
    }
    values.update(counts)
    return ManifestFile.from_args(**values)


def both_lists(
    tmp: Path,
    name: str,
    *,
    new: list[ManifestFile],
    previous_ours: str | bytes | None,
    previous_theirs: str | None,
    version: int = 2,
    snapshot_id: int,
    parent: int | None,
    seq: int | None,
    compression: str = "gzip",
) -> tuple[str, str, ManifestListWritten]:
    theirs = f"{tmp}/{name}-theirs.avro"
    ours = f"{tmp}/{name}-ours.avro"
    head: dict[str, Any] = {
        "format_version": version,
        "snapshot_id": snapshot_id,
        "parent_snapshot_id": parent,
        "sequence_number": seq,
        "compression": compression,
    }
    # Each its own copies: pyiceberg's list writer sets the sequence numbers in the ManifestFiles it is given
    # (its shallow copy shares their values).
    mine = copy.deepcopy(new)
    pyiceberg_manifest_list(IO, theirs, **head, new_manifests=copy.deepcopy(new), previous=previous_theirs)
    written = write_manifest_list(
        IO.new_output(ours), **head, new_manifests=mine, previous=previous_ours, io=IO
    )
    assert [manifest_file_fields(m) for m in mine] == [
        manifest_file_fields(m) for m in new
    ]  # ours left as given
    assert written.length == os.path.getsize(ours)
    return ours, theirs, written


def assert_same_lists(ours: str, theirs: str) -> None:
    assert_same_files(ours, theirs)
    got = [manifest_file_fields(m) for m in read_manifest_list(IO.new_input(ours))]
    want = [manifest_file_fields(m) for m in read_manifest_list(IO.new_input(theirs))]
    assert got == want


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("compression", ["null", "gzip", "zstd"])
def test_list_chain_over_appends(tmp_path: Path, version: int, compression: str) -> None:
    """Appends one after another, each list from the one before: pyiceberg's chain and ours stay equal."""
    prev_ours: str | None = None
    prev_theirs: str | None = None
    for k in range(1, 7):
        new = [manifest_of(k)]
        ours, theirs, written = both_lists(
            tmp_path,
            f"l{k}",
            new=new,
            previous_ours=prev_ours,
            previous_theirs=prev_theirs,
            version=version,
            snapshot_id=k,
            parent=k - 1 if k > 1 else None,
            seq=k if version == 2 else None,
            compression=compression,
        )
        assert_same_lists(ours, theirs)
        assert written.manifests == k
        assert written.copied == (k > 1)
        # Ours on pyiceberg's previous list: the same file again, copied (same schema).
        if prev_theirs is not None:
            again = f"{tmp_path}/l{k}-ours-on-theirs.avro"
            w = write_manifest_list(
                IO.new_output(again),
                format_version=version,
                snapshot_id=k,
                parent_snapshot_id=k - 1,
                sequence_number=k if version == 2 else None,
                new_manifests=new,
                previous=prev_theirs,
                io=IO,
                compression=compression,
            )
            assert w.copied
            assert_same_lists(again, theirs)
        prev_ours, prev_theirs = ours, theirs
    # The last list: the newest manifest first, the first append's last; v2 sequence numbers as assigned.
    listed = list(read_manifest_list(IO.new_input(prev_ours or "")))
    assert [m.added_snapshot_id for m in listed] == [6, 5, 4, 3, 2, 1]
    if version == 2:
        assert [m.sequence_number for m in listed] == [6, 5, 4, 3, 2, 1]


def test_list_from_a_real_manifest_chain(tmp_path: Path) -> None:
    """Manifests written by our writer, listed by both over 4 appends: their ManifestFiles as returned."""
    spec = SPECS["identity-string"]
    prev_ours: str | None = None
    prev_theirs: str | None = None
    for k in range(1, 5):
        m, _ = both_manifests(tmp_path, files_of(spec, 3, seed=k), spec=spec, snapshot_id=k, name=f"m{k}")
        ours, theirs, _ = both_lists(
            tmp_path,
            f"l{k}",
            new=[m],
            previous_ours=prev_ours,
            previous_theirs=prev_theirs,
            snapshot_id=k,
            parent=k - 1 or None,
            seq=k,
        )
        assert_same_lists(ours, theirs)
        prev_ours, prev_theirs = ours, theirs
        # Each listed manifest reads back through its list: the entries carry the list's sequence numbers.
        for listed in read_manifest_list(IO.new_input(ours)):
            assert all(e.sequence_number == listed.sequence_number for e in listed.fetch_manifest_entry(IO))


def test_list_keeps_only_live_previous_manifests(tmp_path: Path) -> None:
    """As the fast append: a previous manifest without added or existing files is dropped, unless ours."""
    first = [
        manifest_of(11, seq=1),
        manifest_of(12, seq=1, added_files_count=0, existing_files_count=0, deleted_files_count=3),
        manifest_of(13, seq=1, added_files_count=0, existing_files_count=2),
        manifest_of(SNAP, seq=1, added_files_count=0, existing_files_count=0),  # the new snapshot's own id
    ]
    prev_ours, prev_theirs, _ = both_lists(
        tmp_path, "p", new=first, previous_ours=None, previous_theirs=None, snapshot_id=14, parent=None, seq=1
    )
    assert_same_lists(prev_ours, prev_theirs)
    ours, theirs, written = both_lists(
        tmp_path,
        "l",
        new=[manifest_of(SNAP)],
        previous_ours=prev_ours,
        previous_theirs=prev_theirs,
        snapshot_id=SNAP,
        parent=14,
        seq=2,
    )
    assert_same_lists(ours, theirs)
    assert written.copied
    assert [m.added_snapshot_id for m in read_manifest_list(IO.new_input(ours))] == [SNAP, 11, 13, SNAP]


def test_list_previous_as_bytes_and_of_another_codec(tmp_path: Path) -> None:
    _, prev_theirs, _ = both_lists(
        tmp_path,
        "p",
        new=[manifest_of(i, seq=i) for i in range(1, 40)],
        previous_ours=None,
        previous_theirs=None,
        snapshot_id=40,
        parent=None,
        seq=40,
        compression="null",
    )
    ours, theirs, written = both_lists(
        tmp_path,
        "l",
        new=[manifest_of(41)],
        previous_ours=Path(prev_theirs).read_bytes(),
        previous_theirs=prev_theirs,
        snapshot_id=41,
        parent=40,
        seq=41,
        compression="gzip",
    )
    assert written.copied and written.manifests == 40
    assert_same_lists(ours, theirs)


def test_list_previous_of_another_version_is_decoded(tmp_path: Path) -> None:
    """A v1 previous list (a table upgraded to v2) is decoded by pyiceberg and encoded again: still equal."""
    prev_ours, prev_theirs, _ = both_lists(
        tmp_path,
        "p",
        new=[manifest_of(i) for i in range(1, 4)],
        previous_ours=None,
        previous_theirs=None,
        version=1,
        snapshot_id=3,
        parent=None,
        seq=None,
    )
    ours, theirs, written = both_lists(
        tmp_path,
        "l",
        new=[manifest_of(4)],
        previous_ours=prev_ours,
        previous_theirs=prev_theirs,
        snapshot_id=4,
        parent=3,
        seq=4,
    )
    assert not written.copied
    assert written.manifests == 4
    assert_same_lists(ours, theirs)
    # A v1 list has no sequence numbers: read as 0, and so written on.
    assert [m.sequence_number for m in read_manifest_list(IO.new_input(ours))] == [4, 0, 0, 0]


def test_list_previous_missing_a_field_is_decoded(tmp_path: Path) -> None:
    """A previous list whose schema lacks an optional field (another writer's) takes the decode path."""
    schema = json.loads(_list_schema_json(2))
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "key_metadata"]
    olds = [manifest_of(i, seq=i) for i in range(1, 6)]
    prev = f"{tmp_path}/prev-other.avro"
    chunks: list[bytes] = []
    w = AvroContainerWriter(
        chunks.append, json.dumps(schema), codec_name="deflate", metadata={"format-version": "2"}
    )
    for m in olds:
        w.append([getattr(m, f["name"]) for f in schema["fields"]])
    w.close()
    Path(prev).write_bytes(b"".join(chunks))
    assert [m.manifest_path for m in read_manifest_list(IO.new_input(prev))] == [
        m.manifest_path for m in olds
    ]

    ours, theirs, written = both_lists(
        tmp_path,
        "l",
        new=[manifest_of(6)],
        previous_ours=prev,
        previous_theirs=prev,
        snapshot_id=6,
        parent=5,
        seq=6,
    )
    assert not written.copied
    assert_same_lists(ours, theirs)


def test_list_previous_with_unassigned_sequence_numbers_is_decoded(tmp_path: Path) -> None:
    """A previous record with an unassigned sequence number (no writer leaves one) gets pyiceberg's handling.

    The new snapshot's own manifest is given the commit's number; another
    snapshot's is refused, by both writers alike.
    """
    schema = _list_schema_json(2)
    prev = f"{tmp_path}/prev-unassigned.avro"
    for owner, fails in ((7, False), (6, True)):
        olds = [manifest_of(3, seq=3), manifest_of(owner)]
        chunks: list[bytes] = []
        w = AvroContainerWriter(chunks.append, schema, codec_name="null")
        for m in olds:
            w.append([getattr(m, f.name) for f in MANIFEST_LIST_FILE_SCHEMAS[2].fields])
        w.close()
        Path(prev).write_bytes(b"".join(chunks))
        both = {
            "new": [],
            "previous_ours": prev,
            "previous_theirs": prev,
            "snapshot_id": 7,
            "parent": 3,
            "seq": 4,
        }
        if fails:
            head: dict[str, Any] = {"format_version": 2, "snapshot_id": 7, "parent_snapshot_id": 3}
            head |= {"sequence_number": 4, "new_manifests": [], "previous": prev, "compression": "gzip"}
            with pytest.raises(ValueError, match="unassigned sequence number"):
                pyiceberg_manifest_list(IO, f"{tmp_path}/t.avro", **head)
            with pytest.raises(ValueError, match="unassigned sequence number"):
                write_manifest_list(IO.new_output(f"{tmp_path}/o.avro"), **head, io=IO)
            continue
        ours, theirs, written = both_lists(tmp_path, "u", **both)  # type: ignore[arg-type]
        assert not written.copied
        assert_same_lists(ours, theirs)
        assert [m.sequence_number for m in read_manifest_list(IO.new_input(ours))] == [3, 4]


def test_list_sequence_number_rules(tmp_path: Path) -> None:
    """pyiceberg's rules on unassigned sequence numbers and v1's data-only lists, with pyiceberg's errors."""
    out = IO.new_output(f"{tmp_path}/x.avro")
    head: dict[str, Any] = {"parent_snapshot_id": None, "previous": None, "io": IO, "compression": "gzip"}
    with pytest.raises(ValueError, match="unassigned sequence number"):
        write_manifest_list(
            out, format_version=2, snapshot_id=2, sequence_number=1, new_manifests=[manifest_of(1)], **head
        )
    with pytest.raises(ValueError, match="Sequence-number is required"):
        write_manifest_list(
            out, format_version=2, snapshot_id=1, sequence_number=None, new_manifests=[], **head
        )
    deletes = manifest_of(1, content=ManifestContent.DELETES)
    with pytest.raises(ValidationError):
        write_manifest_list(
            out, format_version=1, snapshot_id=1, sequence_number=None, new_manifests=[deletes], **head
        )
    with pytest.raises(ValueError, match="format version 3"):
        write_manifest_list(out, format_version=3, snapshot_id=1, sequence_number=1, new_manifests=[], **head)
    with pytest.raises(ValueError, match="codec"):
        write_manifest_list(
            out,
            format_version=2,
            snapshot_id=1,
            sequence_number=1,
            new_manifests=[],
            **{**head, "compression": "lz4"},
        )
    assert not os.path.exists(f"{tmp_path}/x.avro")


def previous_lists(
    tmp: Path, name: str, olds: list[ManifestFile], version: int, compression: str
) -> tuple[str, str]:
    """A first list of ``olds`` (their sequence numbers assigned in v2), written by both."""
    head: dict[str, Any] = {
        "format_version": version,
        "snapshot_id": 1,
        "parent_snapshot_id": None,
        "sequence_number": 1 if version == 2 else None,
        "compression": compression,
    }
    theirs, ours = f"{tmp}/{name}-theirs.avro", f"{tmp}/{name}-ours.avro"
    pyiceberg_manifest_list(IO, theirs, **head, new_manifests=copy.deepcopy(olds), previous=None)
    write_manifest_list(IO.new_output(ours), **head, new_manifests=olds, previous=None, io=IO)
    return ours, theirs


def test_fuzz_lists(tmp_path: Path) -> None:
    """Random previous lists (sizes, dead manifests, codecs, who wrote them) under random new manifests."""
    rng = random.Random(99)
    for i in range(16):
        version = rng.choice([1, 2])
        n = rng.choice([0, 1, 7, 60])
        dead = {"added_files_count": 0, "existing_files_count": 0}
        olds = [manifest_of(j, seq=j, **(dead if rng.random() < 0.2 else {})) for j in range(2, n + 2)]
        prev_ours, prev_theirs = previous_lists(
            tmp_path, f"p{i}", olds, version, rng.choice(["null", "gzip"])
        )
        snap = 10_000 + i
        ours, theirs, written = both_lists(
            tmp_path,
            f"l{i}",
            new=[manifest_of(snap) for _ in range(rng.randint(0, 2))],
            previous_ours=rng.choice([prev_ours, prev_theirs]),
            previous_theirs=prev_theirs,
            version=version,
            snapshot_id=snap,
            parent=1,
            seq=n + 2 if version == 2 else None,
            compression=rng.choice(["null", "gzip", "zstd"]),
        )
        assert written.copied
        assert_same_lists(ours, theirs)


# -- a real table -------------------------------------------------------------------------------------------


def test_a_real_table_reads_our_snapshot(tmp_path: Path) -> None:
    """A SQL-catalog table appended by pyiceberg, then a snapshot of ours: the table reads every row back."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table.snapshots import Operation, Snapshot, Summary
    from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
    from pyiceberg.transforms import IdentityTransform

    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=(tmp_path / "wh").as_uri())
    cat.create_namespace("ns")
    arrow_schema = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    tbl = cat.create_table("ns.t", schema=arrow_schema)
    with tbl.update_spec() as update:
        update.add_field("name", IdentityTransform(), "name")
    # Our Parquet files carry no field ids: the table maps them by name (as pyiceberg's add_files sets).
    mapping = tbl.metadata.schema().name_mapping.model_dump_json()
    tbl.transaction().set_properties({"schema.name-mapping.default": mapping}).commit_transaction()
    tbl = cat.load_table("ns.t")
    for k in range(3):
        tbl.append(pa.table({"id": [k, k + 10], "name": ["a", "a"]}, schema=arrow_schema))
    tbl = cat.load_table("ns.t")
    meta = tbl.metadata
    parent = tbl.current_snapshot()
    assert parent is not None

    # Our append: two Parquet files of one partition each, described by pyiceberg from their footers.
    paths = []
    for k, name in enumerate(["b", "c"]):
        p = tmp_path / "wh" / f"ours-{k}.parquet"
        pq.write_table(pa.table({"id": [100 + k], "name": [name]}, schema=arrow_schema), p)
        paths.append(p.as_uri())
    data_files = [parquet_file_to_data_file(tbl.io, meta, p) for p in paths]
    snapshot_id = meta.new_snapshot_id()
    seq = meta.next_sequence_number()
    manifest = write_manifest(
        tbl.io.new_output(f"{meta.location}/metadata/ours-m0.avro"),
        format_version=meta.format_version,
        spec=meta.spec(),
        schema=meta.schema(),
        snapshot_id=snapshot_id,
        data_files=data_files,
        compression="gzip",
    )
    list_path = f"{meta.location}/metadata/snap-{snapshot_id}-ours.avro"
    written = write_manifest_list(
        tbl.io.new_output(list_path),
        format_version=meta.format_version,
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=seq,
        new_manifests=[manifest],
        previous=parent.manifest_list,
        io=tbl.io,
        compression="gzip",
    )
    assert written.copied and written.manifests == 4
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent.snapshot_id,
        sequence_number=seq,
        manifest_list=list_path,
        summary=Summary(operation=Operation.APPEND),
        schema_id=meta.current_schema_id,
    )
    cat.commit_table(
        tbl,
        requirements=(AssertRefSnapshotId(snapshot_id=parent.snapshot_id, ref="main"),),
        updates=(
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(
                snapshot_id=snapshot_id, parent_snapshot_id=parent.snapshot_id, ref_name="main", type="branch"
            ),
        ),
    )
    tbl = cat.load_table("ns.t")
    got = tbl.scan().to_arrow().sort_by("id")
    assert got["id"].to_pylist() == [0, 1, 2, 10, 11, 12, 100, 101]
    assert sorted(tbl.scan(row_filter="name == 'c'").to_arrow()["id"].to_pylist()) == [101]
    # And pyiceberg appends on top of our snapshot: its list copies ours.
    tbl.append(pa.table({"id": [200], "name": ["d"]}, schema=arrow_schema))
    tbl = cat.load_table("ns.t")
    assert len(tbl.scan().to_arrow()) == 9
    current = tbl.current_snapshot()
    assert current is not None
    assert len(current.manifests(tbl.io)) == 5
