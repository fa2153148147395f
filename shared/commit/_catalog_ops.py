"""The synchronous pyiceberg side of the table step: open the catalog, find a job's snapshot, commit.

pyiceberg is imported lazily (it is the optional ``tables`` extra): a process
that never meets a bound dataset does not need it. Everything here blocks and
runs in a worker thread (see :mod:`._catalog`).

Exactly once rests on two things: the check (a snapshot of the table carries
this job's ``commitfleet.job`` / ``commitfleet.dataset`` properties) and the
optimistic commit based on the metadata that check read (pyiceberg asserts
the branch head, or the table's absence for a create). pyiceberg's own commit
retry would rebase a refused append onto the new head and land it a second
time, so it is switched off for our transactions (on a local copy of the
metadata only: the table's properties in the catalog are not changed).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import msgspec

from .._errors import OutcomeUnknown, TransientError
from ..settings import Settings, TableMode
from . import _iceberg_append as iceberg_append
from ._errors import CommitStepFailed
from ._iceberg_props import INNER_IO_IMPL, PY_IO_IMPL
from ._table_files import DescribedFile, data_files

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from ._iceberg_append import StagedAppend
    from ._sql_catalog import StagedCommit
    from ._table_io import WriteBatch

JOB_PROPERTY = "commitfleet.job"
DATASET_PROPERTY = "commitfleet.dataset"
# A streaming job's micro-batch, in its snapshot's summary (docs/streaming.md).
STREAM_APP_PROPERTY = "commitfleet.stream.app"
STREAM_BATCH_PROPERTY = "commitfleet.stream.batch"
STREAM_QUERY_PROPERTY = "commitfleet.stream.query"

TABLE_IO_IMPL = "shared.commit.TableFileIO"
"""The table step's file IO (:mod:`._table_io`), as pyiceberg's ``py-io-impl`` names it."""
PY_CATALOG_IMPL = "py-catalog-impl"
SQL_CATALOG_IMPL = "shared.commit.SqlTableCatalog"
"""The table step's SQL catalog (:mod:`._sql_catalog`), as pyiceberg's ``py-catalog-impl`` names it."""

_catalogs: dict[bytes, Catalog] = {}
_catalogs_lock = threading.Lock()


def _store_root(settings: Settings, store_url: str) -> str:
    return (store_url or settings.store.url).rstrip("/")


def catalog_properties(settings: Settings, store_url: str) -> dict[str, str]:
    """Return the pyiceberg catalog properties ``settings.tables`` describes, for a store at ``store_url``.

    The warehouse defaults to the store's ``_tables/warehouse`` folder, and the
    file IO gets the store's S3 endpoint and region: the same store, the same
    credentials (the SDK's standard places: AWS env vars, profiles, roles).
    The file IO is :data:`TABLE_IO_IMPL` around the one pyiceberg would use (a
    ``py-io-impl`` of ``tables.properties`` moves to :data:`INNER_IO_IMPL`).

    Raises:
        CommitStepFailed: a SQL catalog without ``uri`` on a store that is not local.
    """
    t = settings.tables
    root = _store_root(settings, store_url)
    props: dict[str, str] = {"type": t.catalog}
    uri = t.uri
    if t.catalog == "sql" and not uri:
        if not root.startswith("file://"):
            raise CommitStepFailed("tables.uri must be set for a SQL catalog when the store is not local")
        uri = "sqlite:///" + unquote(urlsplit(root).path) + "/_tables/catalog.db"
    if uri:
        props["uri"] = uri
    props["warehouse"] = t.warehouse or f"{root}/_tables/warehouse"
    if root.startswith("s3://"):
        props["py-io-impl"] = "pyiceberg.io.pyarrow.PyArrowFileIO"
        if settings.store.s3_endpoint_url:
            props["s3.endpoint"] = settings.store.s3_endpoint_url
        if settings.store.s3_region:
            props["s3.region"] = settings.store.s3_region
    props.update(t.properties)
    # The table's file IO keeps its metadata files in memory (see _table_io), around the IO
    # pyiceberg would have used: the one configured, else its pick for the location.
    inner = props.pop(PY_IO_IMPL, None)
    if inner and inner != TABLE_IO_IMPL:
        props[INNER_IO_IMPL] = inner
    props[PY_IO_IMPL] = TABLE_IO_IMPL
    return props


def open_catalog(settings: Settings, store_url: str) -> Catalog:
    """Return the catalog of ``settings.tables`` (one per configuration and process, then reused).

    Blocking. Raises:
        CommitStepFailed: pyiceberg is not installed, or the catalog is misconfigured.
        TransientError: the catalog cannot be reached now.
    """
    props = catalog_properties(settings, store_url)
    key = msgspec.json.encode([settings.tables.name, props])
    with _catalogs_lock:
        found = _catalogs.get(key)
        if found is not None:
            return found
        try:
            from pyiceberg.catalog import load_catalog
        except ImportError as exc:
            raise CommitStepFailed(
                f"pyiceberg is not installed (pip install 'commitfleet[tables]'): {exc}"
            ) from exc
        if props.get("uri", "").startswith("sqlite:////"):
            # SQLite creates the file, not its folder.
            os.makedirs(os.path.dirname(props["uri"][len("sqlite:///") :]), exist_ok=True)
        if props.get("type") == "sql" and PY_CATALOG_IMPL not in props:
            # pyiceberg's SQL catalog, keeping parsed metadata (_sql_catalog); it refuses a type beside it.
            props = {k: v for k, v in props.items() if k != "type"} | {PY_CATALOG_IMPL: SQL_CATALOG_IMPL}
        try:
            cat = load_catalog(settings.tables.name, **props)
        except (ValueError, TypeError, NotImplementedError) as exc:
            raise CommitStepFailed(f"tables: catalog {settings.tables.catalog} misconfigured: {exc}") from exc
        except OSError as exc:
            raise TransientError(f"tables: catalog unreachable: {exc}") from exc
        _catalogs[key] = cat
        return cat


def split_identifier(table: str) -> tuple[str, ...]:
    """Return ``namespace..., name`` of ``table``. Raises CommitStepFailed on a malformed identifier."""
    parts = tuple(table.split("."))
    if len(parts) < 2 or not all(parts):
        raise CommitStepFailed(f"table {table!r} is not namespace.name")
    return parts


def job_snapshot(tbl: Table, dataset: str, job: str) -> int | None:
    """Return the id of the snapshot of ``tbl`` that carries this job's commit of ``dataset``, or None."""
    for snap in tbl.metadata.snapshots:
        summary = snap.summary
        if (
            summary is not None
            and summary.get(JOB_PROPERTY) == job
            and summary.get(DATASET_PROPERTY) == dataset
        ):
            return snap.snapshot_id
    return None


def load_table(cat: Catalog, table: str) -> Table | None:
    """Return the table, or None when it does not exist. Blocking; raises as :func:`classify`."""
    from pyiceberg.exceptions import NoSuchTableError

    from ._sql_catalog import shared_metadata

    try:
        tbl = cat.load_table(split_identifier(table))
    except NoSuchTableError:
        return None
    tbl.metadata = shared_metadata(tbl.metadata)  # no deep copies of it in the transaction (_sql_catalog)
    return tbl


def _strict(tbl: Table, batch: WriteBatch) -> Table:
    """Return ``tbl`` with pyiceberg's commit retry off (local copy: see the module doc).

    Its file IO writes manifests and manifest lists in the background into ``batch``
    (when it is the step's own, :mod:`._table_io`).
    """
    from pyiceberg.table import Table as _Table

    from ._table_io import TableFileIO

    props = {**tbl.metadata.properties, "commit.retry.num-retries": "0"}
    md = tbl.metadata.model_copy(update={"properties": props})
    io = tbl.io.deferring(batch) if isinstance(tbl.io, TableFileIO) else tbl.io
    return _Table(
        tbl.name(), metadata=md, metadata_location=tbl.metadata_location, io=io, catalog=tbl.catalog
    )


def _transaction(tbl: Table) -> Any:
    """Return a transaction on ``tbl`` that works out its staged metadata once per staged change.

    pyiceberg's ``Transaction.table_metadata`` applies the staged updates to a
    deep copy of the table's whole metadata each time it is read, and an append
    reads it about 17 times: with a few dozen snapshots in the table's history,
    those copies were over half of the table step's CPU (docs/tables.md,
    "Cost"). Its value only changes when a change is staged (``_updates`` is
    then a new tuple), and no reader mutates it (pyiceberg's models are
    frozen), so it is computed once per ``_updates`` and shared.
    """
    from pyiceberg.table import Transaction
    from pyiceberg.table.update import update_table_metadata

    class _Transaction(Transaction):
        _staged: tuple[Any, Any] | None = None

        @property
        def table_metadata(self) -> Any:
            updates = self._updates
            if not updates:
                return self._table.metadata  # nothing staged: the table's own (frozen) metadata
            staged = self._staged
            if staged is None or staged[0] is not updates:
                staged = (updates, update_table_metadata(self._table.metadata, updates))
                self._staged = staged
            return staged[1]

    return _Transaction(tbl)


def _arrow_schema(tbl_io: Any, path: str) -> Any:
    import pyarrow.parquet as pq

    with tbl_io.new_input(path).open() as stream:
        return pq.read_schema(stream)


def commit_files(
    cat: Catalog,
    table: str,
    mode: TableMode,
    dataset: str,
    job: str,
    paths: Sequence[str],
    check: Callable[[], None],
    extra_properties: dict[str, str] | None = None,
    described: Mapping[str, DescribedFile] | None = None,
    prepared: PreparedAppend | None = None,
) -> bool:
    """Make the job's snapshot exist: check, then one optimistic transaction based on what was read.

    With ``prepared`` (:func:`prepare_append`'s, earlier in the same holding
    of the dataset's lock), the catalog's row moves to its metadata at once
    when the table has not moved since; else as without it.

    ``paths`` are the published Parquet files' full URIs; ``check`` is called
    just before the commit (the lease); ``extra_properties`` go into the
    snapshot's summary too (a streaming batch's); ``described`` (by URI) the
    sizes and statistics producers sent, from which those files' data files
    are built without reading their footers (:mod:`._table_files`). Blocking.

    Returns:
        True when this call committed the snapshot, False when it was there
        (before, or landed by another holder whose commit beat ours).

    Raises:
        CommitStepFailed: bad input: the table is missing (not ``create``),
            a file's schema does not match the table's, nothing to create from.
        TransientError: our commit lost to a concurrent one of another job, or
            the catalog/store failed; the retry re-checks.
        OutcomeUnknown: the catalog could not say whether the commit landed.
    """
    from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError

    from ._sql_catalog import SqlTableCatalog
    from ._table_io import WriteBatch

    if prepared is not None and isinstance(cat, SqlTableCatalog):
        check()
        try:
            cat.finish_commit(prepared.table, prepared.commit)
            return True
        except CommitFailedException:
            pass  # the table moved since it was prepared: read, check and commit again below
    props = {**(extra_properties or {}), JOB_PROPERTY: job, DATASET_PROPERTY: dataset}
    ident = split_identifier(table)
    tbl = load_table(cat, table)
    if tbl is not None and job_snapshot(tbl, dataset, job) is not None:
        return False
    batch = WriteBatch()
    try:
        if tbl is None:
            if mode != "create":
                raise CommitStepFailed(
                    f"table {table} does not exist (mode {mode}; only 'create' creates it)"
                )
            if not paths:
                raise CommitStepFailed(f"table {table}: mode create, but the job published no Parquet file")
            from pyiceberg.io import load_file_io

            io = load_file_io(cat.properties, paths[0])
            schema = _arrow_schema(io, paths[0])
            try:
                cat.create_namespace_if_not_exists(ident[:-1])
            except NoSuchNamespaceError as exc:  # a parent namespace missing in a nested catalog
                raise CommitStepFailed(f"table {table}: {exc}") from exc
            txn: Any = cat.create_table_transaction(ident, schema)
            _append(txn, io, paths, props, described or {})
        else:
            # ``create`` on a table that exists appends, as ``append`` does.
            if mode != "overwrite" and iceberg_append.applies(tbl.metadata):
                staged = _stage_lean(tbl, batch, paths, props, described)
                check()
                _commit_staged(cat, tbl, staged, batch)
                return True
            strict = _strict(tbl, batch)
            txn = _transaction(strict)
            if mode == "overwrite":
                _overwrite(tbl, txn, paths, props, described or {})
            else:
                _append(txn, strict.io, paths, props, described or {})
        check()
        if isinstance(cat, SqlTableCatalog) and tbl is not None:
            # Its conditional UPDATE is on the metadata location read above: no second load; and it
            # waits for the batch's uploads after writing the new metadata file, before that UPDATE.
            with cat.based_on(tbl, batch):
                txn.commit_transaction()
        else:
            batch.wait()  # the manifests are in the store before the catalog points at them
            txn.commit_transaction()
    except CommitFailedException as exc:
        again = load_table(cat, table)
        if again is not None and job_snapshot(again, dataset, job) is not None:
            return False  # another holder landed it between our read and our commit
        raise TransientError(f"table {table}: a concurrent commit won ({exc}); re-checking") from exc
    except ValueError as exc:
        # pyiceberg's answer to a file whose schema the table cannot take.
        raise CommitStepFailed(f"table {table}: schema mismatch: {exc}") from exc
    finally:
        # Nothing of this call is written after it returns (a stopped holder changes nothing later).
        batch.settle()
    return True


class PreparedAppend:
    """An append staged ahead of its turn: the table as read, and its next metadata (all files stored)."""

    __slots__ = ("commit", "table")

    def __init__(self, table: Table, commit: StagedCommit) -> None:
        self.table = table
        self.commit = commit


def prepare_append(
    cat: Catalog,
    table: str,
    mode: TableMode,
    dataset: str,
    job: str,
    paths: Sequence[str],
    extra_properties: dict[str, str] | None = None,
    described: Mapping[str, DescribedFile] | None = None,
) -> PreparedAppend | None:
    """Stage the job's append and write all its files, moving no pointer; None where it cannot serve.

    Everything of :func:`commit_files` but its last statement, for an append
    (``append``, or ``create`` of a table that exists) the lean path takes
    (:func:`._iceberg_append.applies`, a SQL catalog that counts rows): the
    table read, the data files built, the manifest, manifest list and new
    metadata file written and uploaded. Nothing points
    at them until ``commit_files(..., prepared=...)``; if that never comes,
    or the table moves first, they are files no snapshot refers to (as any
    refused optimistic commit leaves). None also when the table is missing,
    the job's snapshot is there already, or a file does not fit (the commit
    in turn meets and reports each of those itself). Blocking.

    Raises:
        CommitfleetError, pyiceberg's, SQLAlchemy's and the store's errors: as :func:`commit_files`.
    """
    from ._sql_catalog import SqlTableCatalog
    from ._table_io import WriteBatch

    if mode == "overwrite" or not isinstance(cat, SqlTableCatalog) or not cat.can_stage():
        return None
    tbl = load_table(cat, table)
    if tbl is None or job_snapshot(tbl, dataset, job) is not None or not iceberg_append.applies(tbl.metadata):
        return None
    props = {**(extra_properties or {}), JOB_PROPERTY: job, DATASET_PROPERTY: dataset}
    batch = WriteBatch()
    try:
        staged = _stage_lean(tbl, batch, paths, props, described)
        commit = cat.stage_commit(tbl, staged.requirements, staged.updates, batch)
        batch.wait()
    except ValueError:
        return None  # a file the table cannot take: the commit in turn says so
    finally:
        batch.settle()  # nothing of this call is written after it returns
    return PreparedAppend(tbl, commit)


def _stage_lean(
    tbl: Table,
    batch: WriteBatch,
    paths: Sequence[str],
    props: dict[str, str],
    described: Mapping[str, DescribedFile] | None,
) -> StagedAppend:
    """Stage the lean append of ``paths`` to ``tbl``, its manifests uploading into ``batch``.

    Raises: as :func:`._iceberg_append.stage_append` and :func:`data_files`.
    """
    from ._table_io import TableFileIO

    # The step's own file IO writes the manifests in the background (the caller waits for ``batch``).
    io = tbl.io.deferring(batch) if isinstance(tbl.io, TableFileIO) else tbl.io
    files = data_files(io, tbl.metadata, paths, described or {})
    return iceberg_append.stage_append(tbl, io, files, props)


def _commit_staged(cat: Catalog, tbl: Table, staged: StagedAppend, batch: WriteBatch) -> None:
    """Commit a staged append to ``tbl`` through ``cat``, once its manifests are in the store.

    Raises: as ``Catalog.commit_table`` (CommitFailedException when the table moved since it was read).
    """
    from ._sql_catalog import SqlTableCatalog

    if isinstance(cat, SqlTableCatalog):
        cat.commit_staged(tbl, staged.requirements, staged.updates, batch)
    else:
        batch.wait()
        cat.commit_table(tbl, staged.requirements, staged.updates)


def _name_mapping(txn: Any) -> None:
    """Record the table schema's name mapping when the table has none (as ``add_files`` does)."""
    from pyiceberg.table import TableProperties

    if txn.table_metadata.name_mapping() is None:
        mapping = txn.table_metadata.schema().name_mapping
        txn.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING: mapping.model_dump_json()})


def _append(
    txn: Any, io: Any, paths: Sequence[str], props: dict[str, str], described: Mapping[str, DescribedFile]
) -> None:
    """Stage one append snapshot of ``paths``: pyiceberg's ``add_files``, with data files from ``described``.

    The same snapshot producer as ``add_files`` picks (merge-append when the
    table enables manifest merging, else fast-append). Raises ValueError on
    duplicate paths or a file the table's schema cannot take.
    """
    from pyiceberg.table import TableProperties
    from pyiceberg.utils.properties import property_as_bool

    if len(paths) != len(set(paths)):
        raise ValueError("File paths must be unique")
    _name_mapping(txn)
    merge = property_as_bool(
        txn.table_metadata.properties,
        TableProperties.MANIFEST_MERGE_ENABLED,
        TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT,
    )
    update = txn.update_snapshot(snapshot_properties=props)
    with update.merge_append() if merge else update.fast_append() as append:
        for df in data_files(io, txn.table_metadata, paths, described):
            append.append_data_file(df)


def _overwrite(
    tbl: Table, txn: Any, paths: Sequence[str], props: dict[str, str], described: Mapping[str, DescribedFile]
) -> None:
    """Stage one ``overwrite`` snapshot: every current data file out, the job's files in."""
    _name_mapping(txn)
    current = [task.file for task in tbl.scan().plan_files()]
    with txn.update_snapshot(snapshot_properties=props).overwrite() as ow:
        for f in current:
            ow.delete_data_file(f)
        for df in data_files(tbl.io, txn.table_metadata, paths, described):
            ow.append_data_file(df)


def classify(exc: Exception, what: str) -> Exception:
    """Return the commitfleet error for a failure of a catalog call that is not one of ours.

    An unknown-outcome from the catalog stays unknown (re-check, retry); any
    other failure of the catalog or the store is transient (retried under the
    commit budget, then quarantined with its reason).
    """
    name = type(exc).__name__
    if name == "CommitStateUnknownException":
        return OutcomeUnknown(f"{what}: {name}: {exc}")
    return TransientError(f"{what}: {name}: {exc}")


__all__ = [
    "DATASET_PROPERTY",
    "PreparedAppend",
    "JOB_PROPERTY",
    "STREAM_APP_PROPERTY",
    "STREAM_BATCH_PROPERTY",
    "STREAM_QUERY_PROPERTY",
    "catalog_properties",
    "classify",
    "commit_files",
    "job_snapshot",
    "load_table",
    "open_catalog",
    "prepare_append",
    "split_identifier",
]
