"""Twin Iceberg tables for the lean append's differential tests: one fed by pyiceberg, one by the lean path.

Both twins reference the very same Parquet files, so everything of their
histories but ids, names and times must match. :func:`table_state` reads a
table's history back field by field with the other twin's snapshot ids
mapped in; :func:`lean_append` appends through
``shared.commit._iceberg_append.stage_append`` and the catalog's
``commit_staged``; :func:`overwrite` is pyiceberg's overwrite of every
current file (the same on both twins).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.commit._iceberg_append import applies, stage_append
from shared.commit._sql_catalog import SqlTableCatalog
from shared.commit._table_files import data_files
from shared.commit._table_io import WriteBatch


def norm_entry(e: Any, ids: Mapping[int, int]) -> tuple[Any, ...]:
    """Return a manifest entry's fields that two equal histories share (snapshot id mapped by ``ids``)."""
    df = e.data_file
    return (
        e.status,
        ids.get(e.snapshot_id, e.snapshot_id),
        e.sequence_number,
        e.file_sequence_number,
        df.content,
        df.file_path,
        df.file_format,
        tuple(df.partition),
        df.record_count,
        df.file_size_in_bytes,
        df.column_sizes,
        df.value_counts,
        df.null_value_counts,
        df.nan_value_counts,
        df.lower_bounds,
        df.upper_bounds,
        df.split_offsets,
        df.sort_order_id,
        df.spec_id,
    )


def norm_manifest(m: Any, ids: Mapping[int, int]) -> tuple[Any, ...]:
    """Return a manifest-list entry's fields that two equal histories share (not its path nor length)."""
    parts = [(p.contains_null, p.contains_nan, p.lower_bound, p.upper_bound) for p in m.partitions or []]
    return (
        m.partition_spec_id,
        m.content,
        m.sequence_number,
        m.min_sequence_number,
        ids.get(m.added_snapshot_id, m.added_snapshot_id),
        m.added_files_count,
        m.existing_files_count,
        m.deleted_files_count,
        m.added_rows_count,
        m.existing_rows_count,
        m.deleted_rows_count,
        parts,
    )


def table_state(tbl: Any, ids: Mapping[int, int]) -> list[Any]:
    """Return everything of ``tbl``'s history that two equal histories share (ids mapped by ``ids``)."""
    out: list[Any] = []
    md = tbl.metadata
    out.append((md.last_sequence_number, len(md.snapshot_log), len(md.metadata_log), md.format_version))
    for snap in md.snapshots:
        summary = dict(snap.summary.additional_properties) if snap.summary else {}
        out.append(
            (
                ids.get(snap.snapshot_id, snap.snapshot_id),
                ids.get(snap.parent_snapshot_id, snap.parent_snapshot_id),
                snap.sequence_number,
                snap.schema_id,
                snap.summary.operation if snap.summary else None,
                summary,
            )
        )
        for m in snap.manifests(tbl.io):
            out.append(norm_manifest(m, ids))
            out.append(
                sorted(norm_entry(e, ids) for e in m.fetch_manifest_entry(tbl.io, discard_deleted=False))
            )
    head = md.current_snapshot()
    out.append(ids.get(head.snapshot_id, head.snapshot_id) if head is not None else None)
    return out


def lean_append(
    cat: SqlTableCatalog, ident: tuple[str, str], paths: Sequence[str], props: Mapping[str, str]
) -> int:
    """Append ``paths`` to the table ``ident`` through the lean path; return the new snapshot's id.

    Raises: AssertionError when :func:`applies` refuses the table; as ``stage_append`` and ``commit_staged``.
    """
    tbl = cat.load_table(ident)
    assert applies(tbl.metadata)
    batch = WriteBatch()
    try:
        io = tbl.io.deferring(batch)
        staged = stage_append(tbl, io, data_files(io, tbl.metadata, paths, {}), props)
        cat.commit_staged(tbl, staged.requirements, staged.updates, batch)
    finally:
        batch.settle()
    return staged.snapshot_id


def overwrite(tbl: Any, paths: Sequence[str], props: Mapping[str, str]) -> None:
    """Overwrite every current data file of ``tbl`` with ``paths`` in one pyiceberg overwrite snapshot."""
    files = data_files(tbl.io, tbl.metadata, paths, {})
    current = [task.file for task in tbl.scan().plan_files()]
    with tbl.transaction() as txn, txn.update_snapshot(snapshot_properties=dict(props)).overwrite() as ow:
        for f in current:
            ow.delete_data_file(f)
        for df in files:
            ow.append_data_file(df)
