"""The lean Iceberg append against pyiceberg's own on tables that are not the plain case.

Twin tables as in ``test_iceberg_append.py``: ``a`` takes each append through pyiceberg's
``add_files``, ``b`` through ``stage_append`` and ``commit_staged``, both referencing the same
Parquet files; every other change (schema, spec, sort order, refs, properties, overwrites,
deletes, an older writer's snapshots) is made the same way on both. After each step the two
histories must match field by field, refs, logs and the manifests' Avro headers included, and
so must what a scan reads. Where the lean path refuses a table (``applies``) or a value, that is
asserted, with pyiceberg's own answer beside it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.transforms import IdentityTransform, TruncateTransform
from pyiceberg.types import LongType, NestedField, StringType

from shared.commit import catalog_properties, open_catalog
from shared.commit._iceberg_append import applies, stage_append
from shared.commit._sql_catalog import SqlTableCatalog
from shared.commit._table_files import data_files
from shared.commit._table_io import WriteBatch
from shared.settings import Settings, StoreSettings
from tests._support.emulators import StoreTarget
from tests._support.iceberg_twins import lean_append, norm_manifest, overwrite, table_state
from tests._support.manifest_files import parse_container, pyiceberg_manifest, pyiceberg_manifest_list
from tests._support.tables import table_settings

SCHEMA = Schema(
    NestedField(1, "id", StringType(), required=False),
    NestedField(2, "amount", LongType(), required=False),
    NestedField(3, "region", StringType(), required=False),
)
BY_REGION = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "region"))
A, B = ("lake", "a"), ("lake", "b")


class Twins:
    """Two tables of one catalog fed the same files: ``a`` by pyiceberg, ``b`` by the lean append."""

    def __init__(
        self,
        tmp: Path,
        *,
        spec: PartitionSpec | None = None,
        sort_order: SortOrder | None = None,
        properties: Mapping[str, str] | None = None,
        mapped: bool = True,
    ) -> None:
        target = StoreTarget("local", (tmp / "store").as_uri(), StoreSettings())
        self.settings: Settings = table_settings(target, tmp)
        self.store_url = target.url
        cat = open_catalog(self.settings, target.url)
        assert isinstance(cat, SqlTableCatalog)
        self.cat = cat
        cat.create_namespace_if_not_exists(("lake",))
        extra: dict[str, Any] = {} if sort_order is None else {"sort_order": sort_order}
        for ident in (A, B):
            cat.create_table(
                ident,
                SCHEMA,
                partition_spec=spec or PartitionSpec(),
                properties=dict(properties or {}),
                **extra,
            )
        if mapped:
            # The name mapping add_files records on a first append, set up front: every append is then lean.
            self.both(
                lambda t: (
                    t.transaction()
                    .set_properties(
                        **{TableProperties.DEFAULT_NAME_MAPPING: t.schema().name_mapping.model_dump_json()}
                    )
                    .commit_transaction()
                )
            )
        self.data = tmp / "data"
        self.data.mkdir()
        self._n = 0

    def tables(self) -> tuple[Table, Table]:
        return self.cat.load_table(A), self.cat.load_table(B)

    def both(self, change: Callable[[Table], object]) -> None:
        """Make the same pyiceberg change to both twins (each read afresh)."""
        for tbl in self.tables():
            change(tbl)

    def file(self, region: str | None, rows: int = 3, *, note: str | None = None, amount: int = 0) -> str:
        """Write a new Parquet file of ``rows`` rows of one region (and a ``note`` column if given)."""
        self._n += 1
        name = f"f{self._n:04d}"
        cols: dict[str, Any] = {
            "id": pa.array([f"{name}-{i}" for i in range(rows)], pa.string()),
            "amount": pa.array([amount + i for i in range(rows)], pa.int64()),
            "region": pa.array([region] * rows, pa.string()),
        }
        if note is not None:
            cols["note"] = pa.array([note] * rows, pa.string())
        path = self.data / f"{name}.parquet"
        pq.write_table(pa.table(cols), path)
        return path.as_uri()

    def append(self, paths: Sequence[str], props: Mapping[str, str] | None = None) -> None:
        """Append ``paths``: pyiceberg's ``add_files`` on ``a``, the lean path on ``b``; then check both."""
        summary = dict(props) if props is not None else {"commitfleet.job": f"j{self._n}"}
        self.cat.load_table(A).add_files(list(paths), snapshot_properties=summary)
        lean_append(self.cat, B, paths, summary)
        self.check()

    def ids(self) -> dict[int, int]:
        """Return b's snapshot ids mapped to a's, by their place in the history (of equal lengths)."""
        ta, tb = self.tables()
        assert len(ta.metadata.snapshots) == len(tb.metadata.snapshots)
        return {
            sb.snapshot_id: sa.snapshot_id
            for sa, sb in zip(ta.metadata.snapshots, tb.metadata.snapshots, strict=True)
        }

    def check(self) -> None:
        """Assert the twins' histories, refs, headers and scans are equal (ids mapped)."""
        ta, tb = self.tables()
        ids = self.ids()
        assert full_state(tb, ids) == full_state(ta, {})
        for ref in ta.metadata.refs:
            got = tb.scan(snapshot_id=tb.metadata.refs[ref].snapshot_id).to_arrow().sort_by("id")
            want = ta.scan(snapshot_id=ta.metadata.refs[ref].snapshot_id).to_arrow().sort_by("id")
            assert got.equals(want), ref


def _headers(tbl: Table, path: str, ids: Mapping[int, int]) -> dict[str, Any]:
    with tbl.io.new_input(path).open() as f:
        meta = dict(parse_container(f.read()).meta)
    out: dict[str, Any] = {}
    for key, raw in meta.items():
        value = raw.decode()
        if key in ("snapshot-id", "parent-snapshot-id") and value != "null":
            value = str(ids.get(int(value), int(value)))
        out[key] = json.loads(value) if key in ("avro.schema", "schema", "partition-spec") else value
    return out


def full_state(tbl: Table, ids: Mapping[int, int]) -> list[Any]:
    """Return :func:`table_state`, refs, logs, schemas, specs, sort orders, properties, Avro headers."""
    md = tbl.metadata
    out = table_state(tbl, ids)
    out.append(
        sorted(
            (name, ref.snapshot_ref_type, ids.get(ref.snapshot_id, ref.snapshot_id))
            for name, ref in md.refs.items()
        )
    )
    out.append([ids.get(e.snapshot_id, e.snapshot_id) for e in md.snapshot_log])
    out.append((md.current_schema_id, md.default_spec_id, md.default_sort_order_id, md.last_partition_id))
    out.append((md.schemas, md.partition_specs, md.sort_orders, dict(md.properties)))
    for snap in md.snapshots:
        out.append(_headers(tbl, snap.manifest_list, ids))
        out.extend(_headers(tbl, m.manifest_path, ids) for m in snap.manifests(tbl.io))
    return out


def _lean_refused(cat: SqlTableCatalog, ident: tuple[str, str], paths: Sequence[str]) -> ValueError:
    """Stage and commit a lean append that must raise ValueError; return it (the table must be unchanged)."""
    tbl = cat.load_table(ident)
    batch = WriteBatch()

    def attempt() -> None:
        io = tbl.io.deferring(batch)
        staged = stage_append(tbl, io, data_files(io, tbl.metadata, paths, {}), {})
        cat.commit_staged(tbl, staged.requirements, staged.updates, batch)

    try:
        with pytest.raises(ValueError) as caught:
            attempt()
    finally:
        batch.settle()
    assert cat.load_table(ident).metadata_location == tbl.metadata_location
    return caught.value


# 1. schema evolution


def test_appends_before_and_after_a_column_is_added(tmp_path: Path) -> None:
    t = Twins(tmp_path)
    t.append([t.file("eu"), t.file("us")])
    t.append([t.file("ap")])

    def add_note(tbl: Table) -> None:
        with tbl.update_schema() as u:
            u.add_column("note", StringType())

    t.both(add_note)
    t.check()
    _, tb = t.tables()
    assert tb.metadata.current_schema_id == 1 and applies(tb.metadata)
    # Files of the new schema and files without the new column, in one append and apart.
    t.append([t.file("eu", note="n1"), t.file("us")])
    t.append([t.file(None, note="n2")])
    t.append([t.file("ap")])
    _, tb = t.tables()
    assert [s.schema_id for s in tb.metadata.snapshots] == [0, 0, 1, 1, 1]
    notes = tb.scan().to_arrow().column("note").to_pylist()
    assert sorted(n for n in notes if n is not None) == ["n1"] * 3 + ["n2"] * 3
    assert notes.count(None) == 15


# 2. partition spec evolution


def test_appends_across_partition_spec_changes_keep_each_manifests_spec(tmp_path: Path) -> None:
    t = Twins(tmp_path, spec=BY_REGION)
    t.append([t.file("eu"), t.file("us")])

    def add_trunc(tbl: Table) -> None:
        with tbl.update_spec() as u:
            u.add_field("amount", TruncateTransform(1000), "amount_trunc")

    t.both(add_trunc)
    t.check()
    t.append([t.file("eu", amount=1000), t.file("ap", amount=2000)])

    def drop_region(tbl: Table) -> None:
        with tbl.update_spec() as u:
            u.remove_field("region")

    t.both(drop_region)
    t.check()
    t.append([t.file("eu", amount=3000), t.file(None, amount=3000)])
    t.append([t.file("us", amount=5000)])
    _, tb = t.tables()
    head = tb.current_snapshot()
    assert head is not None
    specs = [m.partition_spec_id for m in head.manifests(tb.io)]
    assert specs == [2, 2, 1, 0]  # the new manifests first, each old one under the spec it was written with
    for expr in ("region == 'eu'", "amount >= 3000", "region == 'ap' or amount < 1000"):
        ta, tb = t.tables()
        got = tb.scan(row_filter=expr).to_arrow().sort_by("id")
        assert got.equals(ta.scan(row_filter=expr).to_arrow().sort_by("id")), expr


# 3. a tag and a second branch


def test_appends_go_to_main_only_beside_a_tag_and_a_branch(tmp_path: Path) -> None:
    t = Twins(tmp_path)
    t.append([t.file("eu")])
    t.append([t.file("us")])
    t.both(
        lambda tbl: (
            tbl.manage_snapshots()
            .create_tag(tbl.metadata.snapshots[0].snapshot_id, "v1")
            .create_branch(tbl.metadata.snapshots[1].snapshot_id, "dev")
            .commit()
        )
    )
    t.check()
    dev_files = [t.file("dev")]
    t.both(lambda tbl: tbl.add_files(dev_files, branch="dev"))
    t.check()
    _, before = t.tables()
    t.append([t.file("ap")])
    t.append([t.file("eu")])
    _, tb = t.tables()
    for ref in ("v1", "dev"):
        assert tb.metadata.refs[ref] == before.metadata.refs[ref]
    main = tb.scan().to_arrow().column("region").to_pylist()
    assert "dev" not in main and len(main) == 12
    dev = tb.scan(snapshot_id=tb.metadata.refs["dev"].snapshot_id).to_arrow().column("region").to_pylist()
    assert sorted(set(dev)) == ["dev", "eu", "us"]
    # A dev append after main moved, then main again: the sequence numbers interleave.
    more = [t.file("dev")]
    t.both(lambda tbl: tbl.add_files(more, branch="dev"))
    t.append([t.file("us")])
    _, tb = t.tables()
    assert [s.sequence_number for s in tb.metadata.snapshots] == [1, 2, 3, 4, 5, 6, 7]


# 4. main missing, other refs present


def test_first_append_to_main_when_only_another_branch_has_snapshots(tmp_path: Path) -> None:
    # pyiceberg refuses a first write to a branch other than main, so main is made, branched, then removed.
    t = Twins(tmp_path)
    t.append([t.file("eu")])
    t.both(
        lambda tbl: (
            tbl.manage_snapshots()
            .create_branch(tbl.metadata.snapshots[0].snapshot_id, "dev")
            .remove_branch("main")
            .commit()
        )
    )
    dev_files = [t.file("dev")]
    t.both(lambda tbl: tbl.add_files(dev_files, branch="dev"))
    t.check()
    _, tb = t.tables()
    assert "main" not in tb.metadata.refs and tb.current_snapshot() is None
    assert applies(tb.metadata)
    t.append([t.file("us")])
    _, tb = t.tables()
    head = tb.current_snapshot()
    assert head is not None and head.parent_snapshot_id is None and head.sequence_number == 3
    assert head.summary is not None and head.summary["total-data-files"] == "1"
    assert len(head.manifests(tb.io)) == 1


def test_append_after_main_was_removed(tmp_path: Path) -> None:
    t = Twins(tmp_path)
    t.append([t.file("eu")])
    t.append([t.file("us")])
    t.both(
        lambda tbl: (
            tbl.manage_snapshots()
            .create_tag(tbl.metadata.snapshots[1].snapshot_id, "keep")
            .remove_branch("main")
            .commit()
        )
    )
    t.check()
    _, tb = t.tables()
    assert tb.current_snapshot() is None and applies(tb.metadata)
    t.append([t.file("ap")])
    t.append([t.file("eu")])
    _, tb = t.tables()
    assert sorted(tb.scan().to_arrow().column("region").to_pylist()) == ["ap"] * 3 + ["eu"] * 3


def test_a_main_that_is_a_tag_is_left_to_pyiceberg_which_refuses_it(tmp_path: Path) -> None:
    t = Twins(tmp_path)
    t.append([t.file("eu")])
    t.both(
        lambda tbl: (
            tbl.manage_snapshots()
            .remove_branch("main")
            .create_tag(tbl.metadata.snapshots[0].snapshot_id, "main")
            .commit()
        )
    )
    ta, tb = t.tables()
    assert not applies(tb.metadata)
    with pytest.raises(ValueError, match="is a tag"):
        ta.add_files([t.file("us")])
    with pytest.raises(ValueError, match="pyiceberg's to stage"):
        stage_append(tb, tb.io, [], {})


# 5. a sort order


def test_appends_to_a_sorted_table(tmp_path: Path) -> None:
    order = SortOrder(SortField(source_id=2, transform=IdentityTransform()))
    t = Twins(tmp_path, sort_order=order)
    t.append([t.file("eu"), t.file("us")])

    def resort(tbl: Table) -> None:
        with tbl.update_sort_order() as u:
            u.desc("region", IdentityTransform())

    t.both(resort)
    t.append([t.file("ap")])
    _, tb = t.tables()
    assert tb.metadata.default_sort_order_id == 2
    head = tb.current_snapshot()
    assert head is not None
    entries = [e for m in head.manifests(tb.io) for e in m.fetch_manifest_entry(tb.io)]
    # add_files records no sort order on a file (it cannot know how the file was written); nor does the lean.
    assert {e.data_file.sort_order_id for e in entries} == {None}


# 6. another writer in between, and a stale base


def test_another_writers_commits_between_lean_appends_and_a_stale_base(tmp_path: Path) -> None:
    t = Twins(tmp_path)
    props = catalog_properties(t.settings, t.store_url)
    other = SqlCatalog(t.settings.tables.name, uri=props["uri"], warehouse=props["warehouse"])

    def by_other(change: Callable[[Table], object]) -> None:
        for ident in (A, B):
            change(other.load_table(ident))

    t.append([t.file("eu"), t.file("us")])
    appended = [t.file("ap"), t.file("eu")]
    by_other(lambda tbl: tbl.add_files(appended))
    t.check()
    t.append([t.file("us")])  # its parent's list was written by pyiceberg, not by this process
    replaced = [t.file("eu"), t.file("us"), t.file("ap")]
    by_other(lambda tbl: overwrite(tbl, replaced, {"by": "other"}))
    t.check()
    t.append([t.file("eu")])
    by_other(lambda tbl: tbl.delete("region == 'eu'"))  # whole files only: no file is rewritten
    t.check()
    _, tb = t.tables()
    head = tb.current_snapshot()
    assert head is not None and head.summary is not None and head.summary.operation == Operation.DELETE
    t.append([t.file("ap")])

    # A stale base: staged on a read, then another writer commits, then the staged commit.
    stale = t.cat.load_table(B)
    batch = WriteBatch()
    io = stale.io.deferring(batch)
    staged = stage_append(stale, io, data_files(io, stale.metadata, [t.file("eu")], {}), {})
    late = [t.file("us")]
    by_other(lambda tbl: tbl.add_files(late))
    moved = t.cat.load_table(B)
    with pytest.raises(CommitFailedException):
        t.cat.commit_staged(stale, staged.requirements, staged.updates, batch)
    batch.settle()
    after = t.cat.load_table(B)
    assert after.metadata_location == moved.metadata_location
    assert staged.snapshot_id not in {s.snapshot_id for s in after.metadata.snapshots}
    t.check()
    t.append([t.file("eu")])
    _, tb = t.tables()
    ops = [s.summary.operation.value for s in tb.metadata.snapshots if s.summary is not None]
    assert ops == [
        "append",
        "append",
        "append",
        "overwrite",
        "append",
        "delete",
        "append",
        "append",
        "append",
    ]


# 7. the manifests' Avro codec


@pytest.mark.parametrize("codec", ["zstd", "gzip", "null", "bzip2", "deflate", "zstandard"])
def test_appends_under_each_avro_codec_and_a_codec_change(tmp_path: Path, codec: str) -> None:
    t = Twins(tmp_path, properties={TableProperties.WRITE_AVRO_COMPRESSION: codec})
    t.append([t.file("eu"), t.file("us")])
    t.append([t.file("ap")])
    # The codec changed under existing lists: the kept records are copied into a list of the new codec.
    t.both(
        lambda tbl: (
            tbl.transaction()
            .set_properties(**{TableProperties.WRITE_AVRO_COMPRESSION: "gzip" if codec != "gzip" else "zstd"})
            .commit_transaction()
        )
    )
    t.append([t.file("eu")])
    _, tb = t.tables()
    head = tb.current_snapshot()
    assert head is not None and len(head.manifests(tb.io)) == 3


@pytest.mark.parametrize("codec", ["uncompressed", "snappy", "lz4"])
def test_a_codec_pyiceberg_cannot_write_is_refused_by_both(tmp_path: Path, codec: str) -> None:
    t = Twins(tmp_path, properties={TableProperties.WRITE_AVRO_COMPRESSION: codec})
    ta, _ = t.tables()
    paths = [t.file("eu")]
    before = ta.metadata_location
    with pytest.raises(Exception) as theirs:
        ta.add_files(paths)
    assert t.cat.load_table(A).metadata_location == before
    ours = _lean_refused(t.cat, B, paths)
    # pyiceberg: ValueError("Unsupported codec"), or ImportError for snappy without its module.
    assert isinstance(theirs.value, ValueError | ImportError), repr(theirs.value)
    assert codec in str(ours)


# 8. a previous summary without totals (an older writer's)


def _older_writers_append(
    cat: SqlTableCatalog, ident: tuple[str, str], paths: list[str], summary: dict[str, str]
) -> None:
    """Commit an append as a writer that records only ``summary`` would (pyiceberg's manifest writers)."""
    tbl = cat.load_table(ident)
    md = tbl.metadata
    files = data_files(tbl.io, md, paths, {})
    sid = md.new_snapshot_id()
    parent = md.snapshot_by_name("main")
    parent_id = parent.snapshot_id if parent is not None else None
    seq = md.next_sequence_number()
    locations = tbl.location_provider()
    tag = uuid.uuid4()
    manifest = pyiceberg_manifest(
        tbl.io,
        locations.new_metadata_location(f"{tag}-m0.avro"),
        format_version=2,
        spec=md.spec(),
        schema=md.schema(),
        snapshot_id=sid,
        data_files=files,
        compression="gzip",
    )
    list_path = locations.new_metadata_location(f"snap-{sid}-0-{tag}.avro")
    pyiceberg_manifest_list(
        tbl.io,
        list_path,
        format_version=2,
        snapshot_id=sid,
        parent_snapshot_id=parent_id,
        sequence_number=seq,
        new_manifests=[manifest],
        previous=parent.manifest_list if parent is not None else None,
        compression="gzip",
    )
    snap = Snapshot(  # type: ignore[call-arg]
        snapshot_id=sid,
        parent_snapshot_id=parent_id,
        manifest_list=list_path,
        sequence_number=seq,
        summary=Summary(Operation.APPEND, **summary),
        schema_id=md.current_schema_id,
    )
    cat.commit_table(
        tbl,
        (AssertRefSnapshotId(snapshot_id=parent_id, ref="main"),),  # type: ignore[call-arg]
        (
            AddSnapshotUpdate(snapshot=snap),
            SetSnapshotRefUpdate(  # type: ignore[call-arg]
                snapshot_id=sid, parent_snapshot_id=parent_id, ref_name="main", type=SnapshotRefType.BRANCH
            ),
        ),
    )


OLDER_SUMMARIES = {
    "operation-only": {},
    "no-totals": {"added-data-files": "1", "added-records": "3"},
    "some-totals": {"added-data-files": "1", "total-records": "3"},
    "zero-totals": {"total-data-files": "0", "total-records": "0", "total-files-size": "0"},
}


@pytest.mark.parametrize("older", sorted(OLDER_SUMMARIES))
@pytest.mark.parametrize("first", [True, False], ids=["older-first", "older-later"])
def test_summaries_after_an_older_writers_snapshot_without_totals(
    tmp_path: Path, older: str, first: bool
) -> None:
    t = Twins(tmp_path)
    if not first:
        t.append([t.file("eu")])
    paths = [t.file("us")]
    for ident in (A, B):
        _older_writers_append(t.cat, ident, paths, OLDER_SUMMARIES[older])
    t.check()
    t.append([t.file("ap"), t.file("eu")])
    t.append([t.file("us")])


def test_a_total_that_is_no_number_is_refused_by_both(tmp_path: Path) -> None:
    t = Twins(tmp_path)
    paths = [t.file("us")]
    for ident in (A, B):
        _older_writers_append(t.cat, ident, paths, {"total-records": "many"})
    more = [t.file("eu")]
    ta, _ = t.tables()
    with pytest.raises(ValueError, match="Could not parse"):
        ta.add_files(more)
    assert "Could not parse" in str(_lean_refused(t.cat, B, more))


# 9. many appends, read back through pyiceberg's inspect tables


def _inspected(tbl: Table, ids: Mapping[int, int]) -> tuple[Any, ...]:
    def mapped(v: Any) -> Any:
        return ids.get(v, v) if isinstance(v, int) else v

    snaps = [
        (mapped(r["snapshot_id"]), mapped(r["parent_id"]), r["operation"], sorted(r["summary"]))
        for r in tbl.inspect.snapshots().drop_columns(["committed_at", "manifest_list"]).to_pylist()
    ]
    manifests = [
        {k: mapped(v) for k, v in r.items()}
        for r in tbl.inspect.manifests().drop_columns(["path", "length"]).to_pylist()
    ]
    entries = sorted(
        json.dumps({k: mapped(v) for k, v in r.items()}, sort_keys=True, default=repr)
        for r in tbl.inspect.entries().to_pylist()
    )
    return snaps, manifests, entries


@pytest.mark.stress  # 6 s: make stress
def test_two_hundred_appends_read_back_alike(tmp_path: Path) -> None:
    t = Twins(tmp_path, spec=BY_REGION)
    regions = ["eu", "us", "ap", None]
    ta, tb = t.tables()
    for r in range(200):
        paths = [t.file(regions[r % 4], rows=1, amount=r)]
        # add_files' duplicate check reads every manifest on every append (~20 s over 200); the files are new.
        ta.add_files(paths, snapshot_properties={"commitfleet.job": f"j{r}"}, check_duplicate_files=False)
        lean_append(t.cat, B, paths, {"commitfleet.job": f"j{r}"})
        ta, tb = t.tables()
    ids = t.ids()
    assert _inspected(tb, ids) == _inspected(ta, {})
    assert tb.scan().to_arrow().sort_by("id").equals(ta.scan().to_arrow().sort_by("id"))
    assert tb.scan(row_filter="region == 'ap'").to_arrow().num_rows == 50
    # The head's list and manifests, headers included (every snapshot's would read 20,000 manifests).
    heads = []
    for tbl, mapping in ((tb, ids), (ta, {})):
        head = tbl.current_snapshot()
        assert head is not None
        manifests = head.manifests(tbl.io)
        heads.append(
            (
                [norm_manifest(m, mapping) for m in manifests],
                _headers(tbl, head.manifest_list, mapping),
                [_headers(tbl, m.manifest_path, mapping) for m in manifests],
            )
        )
    assert heads[0] == heads[1]
    assert len(heads[0][0]) == 200


# An append of no files (a job that published no Parquet file).


def test_an_append_of_no_files(tmp_path: Path) -> None:
    t = Twins(tmp_path)
    t.append([t.file("eu")])
    t.append([])
    t.append([t.file("us")])
