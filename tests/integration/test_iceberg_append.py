"""The lean Iceberg append against pyiceberg's own: two tables fed the same files, read back field by field.

Table ``a`` takes every append through pyiceberg (``add_files``); table ``b`` through
:func:`stage_append` and the catalog's ``commit_staged``. Both reference the very same Parquet files,
so everything but ids, names and times must match: rows, snapshot summaries, manifest-list entries,
manifest entries, sequence numbers, logs. Overwrites (pyiceberg's, on both) in between check that
the lean append keeps exactly the manifests a fast append keeps.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform, TruncateTransform
from pyiceberg.types import LongType, NestedField, StringType

from shared.commit import open_catalog
from shared.commit._iceberg_append import stage_append
from shared.commit._sql_catalog import SqlTableCatalog
from shared.commit._table_files import data_files
from shared.commit._table_io import WriteBatch, local_path
from shared.settings import StoreSettings
from tests._support.emulators import StoreTarget
from tests._support.iceberg_twins import lean_append, overwrite, table_state
from tests._support.tables import table_settings

SCHEMA = Schema(
    NestedField(1, "id", StringType(), required=False),
    NestedField(2, "amount", LongType(), required=False),
    NestedField(3, "region", StringType(), required=False),
)
SPECS = {
    "unpartitioned": PartitionSpec(),
    "identity": PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "region")),
    "two": PartitionSpec(
        PartitionField(3, 1000, IdentityTransform(), "region"),
        PartitionField(2, 1001, TruncateTransform(1000), "amount_trunc"),
    ),
}


def _file(folder: Path, name: str, region: str | None, amounts: list[int]) -> str:
    t = pa.table(
        {
            "id": pa.array([f"{name}-{i}" for i in range(len(amounts))], pa.string()),
            "amount": pa.array(amounts, pa.int64()),
            "region": pa.array([region] * len(amounts), pa.string()),
        }
    )
    path = folder / f"{name}.parquet"
    pq.write_table(t, path)
    return path.as_uri()


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_the_lean_append_writes_what_pyiceberg_writes(tmp_path: Path, spec: str) -> None:
    target = StoreTarget("local", (tmp_path / "store").as_uri(), StoreSettings())
    settings = table_settings(target, tmp_path)
    cat = open_catalog(settings, target.url)
    assert isinstance(cat, SqlTableCatalog)
    cat.create_namespace_if_not_exists(("lake",))
    a = ("lake", "a")
    b = ("lake", "b")
    for ident in (a, b):
        cat.create_table(ident, SCHEMA, partition_spec=SPECS[spec])
    data = tmp_path / "data"
    data.mkdir()
    regions = ["eu", "us", None, "ap"]
    rounds: list[tuple[str, list[str]]] = []
    for r in range(9):
        kind = "overwrite" if r in (4, 7) else "append"
        paths = [
            _file(
                data, f"r{r}-f{i}", regions[(r + i) % len(regions)], [r * 100 + i * 10 + k for k in range(3)]
            )
            for i in range(1 + r % 3)
        ]
        rounds.append((kind, paths))
    ids: dict[int, int] = {}
    for r, (kind, paths) in enumerate(rounds):
        props = {"commitfleet.job": f"job-{r}", "commitfleet.dataset": "orders"}
        ta, tb = cat.load_table(a), cat.load_table(b)
        if kind == "overwrite":
            overwrite(ta, paths, props)
            overwrite(tb, paths, props)
        elif r == 0:
            # The first append records the name mapping: pyiceberg's path on both.
            ta.add_files(paths, snapshot_properties=props)
            tb.add_files(paths, snapshot_properties=props)
        else:
            ta.add_files(paths, snapshot_properties=props)
            lean_append(cat, b, paths, props)
        ta, tb = cat.load_table(a), cat.load_table(b)
        ids[tb.metadata.snapshots[-1].snapshot_id] = ta.metadata.snapshots[-1].snapshot_id
        assert table_state(tb, ids) == table_state(ta, {}), (spec, r, kind)
        got = tb.scan().to_arrow().sort_by("id")
        assert got.equals(ta.scan().to_arrow().sort_by("id")), (spec, r)
    # The last overwrite (round 7) and the append after it: those files' rows only.
    assert cat.load_table(b).scan().to_arrow().num_rows == 3 * (len(rounds[7][1]) + len(rounds[8][1]))


def test_a_staged_commit_on_a_table_that_moved_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    from pyiceberg.exceptions import CommitFailedException

    target = StoreTarget("local", (tmp_path / "store").as_uri(), StoreSettings())
    cat = open_catalog(table_settings(target, tmp_path), target.url)
    assert isinstance(cat, SqlTableCatalog)
    cat.create_namespace_if_not_exists(("lake",))
    ident = ("lake", "t")
    cat.create_table(ident, SCHEMA)
    data = tmp_path / "data"
    data.mkdir()
    cat.load_table(ident).add_files([_file(data, "first", "eu", [1])])
    stale = cat.load_table(ident)
    cat.load_table(ident).add_files([_file(data, "other", "us", [2])])
    moved = cat.load_table(ident)
    batch = WriteBatch()
    io = stale.io.deferring(batch)
    staged = stage_append(stale, io, data_files(io, stale.metadata, [_file(data, "late", "ap", [3])], {}), {})
    with pytest.raises(CommitFailedException):
        cat.commit_staged(stale, staged.requirements, staged.updates, batch)
    batch.settle()
    after = cat.load_table(ident)
    assert after.metadata_location == moved.metadata_location
    assert sorted(after.scan().to_arrow().column("id").to_pylist()) == ["first-0", "other-0"]


def test_old_metadata_files_are_deleted_after_commit_as_pyiceberg_deletes_them(tmp_path: Path) -> None:
    target = StoreTarget("local", (tmp_path / "store").as_uri(), StoreSettings())
    cat = open_catalog(table_settings(target, tmp_path), target.url)
    assert isinstance(cat, SqlTableCatalog)
    cat.create_namespace_if_not_exists(("lake",))
    props = {
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "2",
    }
    a, b = ("lake", "a"), ("lake", "b")
    for ident in (a, b):
        cat.create_table(ident, SCHEMA, properties=props)
    data = tmp_path / "data"
    data.mkdir()
    for r in range(6):
        paths = [_file(data, f"r{r}", "eu", [r])]
        cat.load_table(a).add_files(paths)
        if r == 0:
            cat.load_table(b).add_files(paths)
        else:
            lean_append(cat, b, paths, {})

    def metadata_files(name: str) -> list[Path]:
        return sorted((tmp_path / "store").rglob(f"{name}/metadata/*.metadata.json"))

    ta, tb = cat.load_table(a), cat.load_table(b)
    assert len(tb.metadata.metadata_log) == len(ta.metadata.metadata_log) == 2
    kept = {Path(local_path(m.metadata_file) or "") for m in tb.metadata.metadata_log}
    kept.add(Path(local_path(tb.metadata_location) or ""))
    assert set(metadata_files("b")) == kept
    assert len(metadata_files("a")) == len(metadata_files("b")) == 3
