"""The table step's SQL catalog: pyiceberg's, parsing a metadata file once and not re-loading to commit.

An append through pyiceberg's SQL catalog loaded the table twice: once for
the step's check (a SELECT of the table's row, then the current metadata
file parsed), and again inside ``commit_table``, which compares the row's
metadata location in its conditional UPDATE. Parsing a metadata file is
pydantic over a JSON that grows with the table's history, and an Iceberg
metadata file never changes once written, so:

- the parsed metadata is kept by metadata location while its file's bytes
  are kept by the file IO (:mod:`._table_io`: at most 8 MiB a file), at most
  :data:`MAX_PARSED_BYTES` of such files in all, least recently used first
  out; the row is still read each time, so a new location (another writer's
  commit) is always parsed;
- a commit's own result (the metadata it wrote, as pyiceberg returns it) is
  kept under its new location, so the next load of a table this process
  committed last parses nothing;
- :meth:`SqlTableCatalog.based_on` makes ``commit_table`` take the table the
  transaction was built on as the current one instead of loading it again.
  That is sound because the commit is conditional on exactly that table: the
  UPDATE changes the row only where its metadata location is still the one
  the transaction read, else pyiceberg raises ``CommitFailedException`` (as
  when its requirements fail on a newer table), and the step re-reads and
  checks (see :mod:`._catalog_ops`). The only difference: a commit that lost
  to another writer leaves an unreferenced metadata file behind (as any
  refused optimistic commit of a cloud catalog may).

``open_catalog`` uses it for ``catalog = "sql"`` (pyiceberg's
``py-catalog-impl``); the other catalogs are pyiceberg's own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.io import FileIO
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, TableMetadataV2
from pyiceberg.table.update import update_table_metadata
from pyiceberg.typedef import Identifier
from sqlalchemy import bindparam, select, update

from ._sized_cache import SizedCache
from ._table_io import TableFileIO, WriteBatch, kept_size

MAX_PARSED_BYTES: Final = 32 * 1024 * 1024
"""Parsed metadata kept, in bytes of the metadata files it was parsed from (in memory: a few times that)."""


class _SharedMetadataV2(TableMetadataV2):
    """Version 2 table metadata whose deep copy is itself.

    pyiceberg's ``update_table_metadata`` ends with a deep copy of the whole
    metadata (every snapshot, log entry, schema of the table's history), and an
    append applies its updates twice (the transaction's view, then the
    catalog's commit): about half of the step's CPU with a few dozen
    snapshots. Its models are frozen and its updates build new lists and dicts
    (``model_copy(update=...)``, which keeps this class), so a copy protects
    nothing that is ever changed.
    """

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> _SharedMetadataV2:
        return self


def shared_metadata(metadata: TableMetadata) -> TableMetadata:
    """Return ``metadata`` as :class:`_SharedMetadataV2` (the same fields, not validated again) when it is v2.

    Other format versions are returned as they are (pyiceberg then copies them as before).
    """
    if type(metadata) is not TableMetadataV2:
        return metadata
    return _SharedMetadataV2.model_construct(_fields_set=metadata.model_fields_set, **dict(metadata))


_PARSED: SizedCache[TableMetadata] = SizedCache(MAX_PARSED_BYTES)
"""Parsed metadata by metadata location, sized by the file it was parsed from."""


def _keep_parsed(location: str, metadata: TableMetadata) -> None:
    size = kept_size(location)
    if size is not None:  # else a file too big to keep (or not read through the file IO): parsed every time
        _PARSED.put(location, metadata, size)


class StagedCommit:
    """A commit's new metadata file (written) and its metadata, for :meth:`SqlTableCatalog.finish_commit`."""

    __slots__ = ("location", "metadata")

    def __init__(self, location: str, metadata: TableMetadata) -> None:
        self.location = location
        self.metadata = metadata


class _Statements:
    """The SQL of a load and of a staged commit, for one catalog name (parameters: ns, name, old, new)."""

    def __init__(self, catalog: str, type_filter: Any) -> None:
        row = (
            IcebergTables.catalog_name == catalog,
            IcebergTables.table_namespace == bindparam("ns"),
            IcebergTables.table_name == bindparam("name"),
        )
        select_row = select(
            IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location
        ).where(*row)
        self.select = select_row if type_filter is None else select_row.where(type_filter)
        self.update = (
            update(IcebergTables)
            .where(*row, IcebergTables.metadata_location == bindparam("old"))
            .values(metadata_location=bindparam("new"), previous_metadata_location=bindparam("old"))
        )


class SqlTableCatalog(SqlCatalog):
    """pyiceberg's SQL catalog, parsed metadata kept, a commit based on its read (see the module doc)."""

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        self._based = threading.local()
        self._stmts: _Statements | None = None

    @contextmanager
    def based_on(self, table: Table, uploads: WriteBatch | None = None) -> Iterator[None]:
        """Within the block, a commit of ``table``'s identifier in this thread takes ``table`` as current.

        A commit there also waits for ``uploads`` (its manifests, written in the
        background) after writing the new metadata file and before its UPDATE.
        Yields nothing; the thread's base is reset on exit (also on error or cancel).
        """
        self._based.table, self._based.uploads = table, uploads
        try:
            yield
        finally:
            self._based.table = self._based.uploads = None

    def _statements(self) -> _Statements:
        # Built once: building SQLAlchemy's expressions cost more than running them.
        found = self._stmts
        if found is None:
            found = self._stmts = _Statements(self.name, self._iceberg_type_filter())
        return found

    def load_table(self, identifier: str | Identifier) -> Table:
        """Return the table (the thread's base inside :meth:`based_on`). Raises NoSuchTableError.

        The row is read with one SQL statement on a pooled connection (pyiceberg's
        opens an ORM session for it: most of a cached load's time).
        """
        base: Table | None = getattr(self._based, "table", None)
        if base is not None and base.name() == Catalog.identifier_to_tuple(identifier):
            return base
        namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
        name = Catalog.table_name_from(identifier)
        with self.engine.connect() as conn:
            row = conn.execute(self._statements().select, {"ns": namespace, "name": name}).first()
        if row is None:
            raise NoSuchTableError(f"Table does not exist: {namespace}.{name}")
        return self._convert_orm_to_iceberg(row)

    def can_stage(self) -> bool:
        """True when :meth:`stage_commit` and :meth:`finish_commit` serve (the database counts rows).."""
        return bool(self.engine.dialect.supports_sane_rowcount)

    def stage_commit(
        self, table: Table, requirements: Any, updates: Any, uploads: WriteBatch | None = None
    ) -> StagedCommit:
        """Write the metadata file of ``updates`` applied to ``table`` as read; return it, not yet current.

        pyiceberg's ``commit_table`` up to its UPDATE: the requirements checked
        on ``table``, the updates applied once, the new metadata file written
        under the next version (into ``uploads``, in the background, when the
        file IO is the step's: the caller waits for them before
        :meth:`finish_commit`). Nothing points at it until :meth:`finish_commit`.

        Raises:
            CommitFailedException: a requirement fails on ``table``.
            The file IO's errors: the file could not be written.
        """
        for requirement in requirements:
            requirement.validate(table.metadata)
        metadata = update_table_metadata(
            base_metadata=table.metadata, updates=updates, metadata_location=table.metadata_location
        )
        version = self._parse_metadata_version(table.metadata_location) + 1
        location = load_location_provider(metadata.location, metadata.properties)
        new_location = location.new_table_metadata_file_location(version)
        io = self._load_file_io(properties=metadata.properties, location=new_location)
        if uploads is not None and isinstance(io, TableFileIO):
            io = io.deferring(uploads, metadata_too=True)
        SqlCatalog._write_metadata(metadata, io, new_location)
        return StagedCommit(new_location, metadata)

    def finish_commit(self, table: Table, staged: StagedCommit) -> None:
        """Move ``table``'s row from the location it was read at to ``staged``'s, in one conditional UPDATE.

        Every file ``staged`` refers to must be in the store already. On a
        pooled connection (pyiceberg opens an ORM session: most of its commit's
        time besides the database's own).

        Raises:
            CommitFailedException: the row moved since ``table`` was read (nothing changed).
            SQLAlchemy's errors: the commit failed, or its outcome is unknown.
        """
        ident = table.name()
        params = {
            "ns": Catalog.namespace_to_string(Catalog.namespace_from(ident)),
            "name": Catalog.table_name_from(ident),
            "old": table.metadata_location,
            "new": staged.location,
        }
        with self.engine.begin() as conn:
            if conn.execute(self._statements().update, params).rowcount < 1:
                raise CommitFailedException(f"Table has been updated by another process: {'.'.join(ident)}")
        _keep_parsed(staged.location, shared_metadata(staged.metadata))
        # As pyiceberg's table does after its commit: with write.metadata.delete-after-commit.enabled, the
        # metadata files that left the log go (its delete_files logs a file it could not delete).
        self._delete_old_metadata(table.io, table.metadata, staged.metadata)

    def commit_staged(self, table: Table, requirements: Any, updates: Any, uploads: WriteBatch) -> None:
        """Commit ``updates`` to ``table`` as read, once ``uploads`` ended: pyiceberg's commit, leaner.

        :meth:`stage_commit`, then the uploads waited for, then
        :meth:`finish_commit`; ``commit_table`` where :meth:`can_stage` says no.

        Raises: as those two.
        """
        if not self.can_stage():
            with self.based_on(table, uploads):
                self.commit_table(table, requirements, updates)
            return
        staged = self.stage_commit(table, requirements, updates, uploads)
        uploads.wait()
        self.finish_commit(table, staged)

    def _convert_orm_to_iceberg(self, orm_table: Any) -> Table:
        # The row was read; only the metadata file's parse is saved when its location was seen.
        location = orm_table.metadata_location
        metadata = _PARSED.get(location) if location else None
        if metadata is None:
            table = super()._convert_orm_to_iceberg(orm_table)
            table.metadata = shared_metadata(table.metadata)
            _keep_parsed(table.metadata_location, table.metadata)
            return table
        return Table(
            identifier=(*Catalog.identifier_to_tuple(orm_table.table_namespace), orm_table.table_name),
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(metadata.properties, location),
            catalog=self,
        )

    def _write_metadata(self, metadata: TableMetadata, io: FileIO, metadata_path: str) -> None:  # type: ignore[override]
        # pyiceberg writes the new metadata file just before its UPDATE: the manifests' uploads,
        # started while it built them, end in the same round; the pointer moves only after all.
        super()._write_metadata(metadata, io, metadata_path)
        uploads: WriteBatch | None = getattr(self._based, "uploads", None)
        if uploads is not None:
            uploads.wait()

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> CommitTableResponse:
        """Commit as pyiceberg does, and keep the metadata written under its location. Raises as pyiceberg."""
        response = super().commit_table(table, requirements, updates)
        _keep_parsed(response.metadata_location, response.metadata)
        return response


__all__ = ["MAX_PARSED_BYTES", "SqlTableCatalog", "StagedCommit", "shared_metadata"]
