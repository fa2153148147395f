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
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io import FileIO
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata, TableMetadataV2
from pyiceberg.typedef import Identifier

from ._table_io import WriteBatch, kept_size

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


class _Parsed:
    """Parsed table metadata by metadata location, least recently used first out. Thread-safe."""

    def __init__(self) -> None:
        self._by_location: OrderedDict[str, tuple[TableMetadata, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, location: str) -> TableMetadata | None:
        with self._lock:
            found = self._by_location.get(location)
            if found is None:
                return None
            self._by_location.move_to_end(location)
            return found[0]

    def put(self, location: str, metadata: TableMetadata) -> None:
        size = kept_size(location)
        if size is None:
            return  # a file too big to keep (or not read through the file IO): parsed every time
        with self._lock:
            old = self._by_location.pop(location, None)
            self._bytes += size - (old[1] if old is not None else 0)
            self._by_location[location] = (metadata, size)
            while self._bytes > MAX_PARSED_BYTES:
                _, (_, dropped) = self._by_location.popitem(last=False)
                self._bytes -= dropped


_PARSED = _Parsed()


class SqlTableCatalog(SqlCatalog):
    """pyiceberg's SQL catalog, parsed metadata kept, a commit based on its read (see the module doc)."""

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        self._based = threading.local()

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

    def load_table(self, identifier: str | Identifier) -> Table:
        """Return the table (the thread's base inside :meth:`based_on`). Raises NoSuchTableError."""
        base: Table | None = getattr(self._based, "table", None)
        if base is not None and base.name() == Catalog.identifier_to_tuple(identifier):
            return base
        return super().load_table(identifier)

    def _convert_orm_to_iceberg(self, orm_table: Any) -> Table:
        # The row was read; only the metadata file's parse is saved when its location was seen.
        location = orm_table.metadata_location
        metadata = _PARSED.get(location) if location else None
        if metadata is None:
            table = super()._convert_orm_to_iceberg(orm_table)
            table.metadata = shared_metadata(table.metadata)
            _PARSED.put(table.metadata_location, table.metadata)
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
        _PARSED.put(response.metadata_location, response.metadata)
        return response


__all__ = ["MAX_PARSED_BYTES", "SqlTableCatalog", "shared_metadata"]
