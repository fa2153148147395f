"""The table step's file IO: pyiceberg's own, with the table's metadata files kept in memory once seen.

An Iceberg table's metadata files (``*.metadata.json``, manifest lists and
manifests, ``*.avro``) are written once under a new name each and never
changed (the Iceberg spec), so their bytes can be kept by name. An append
reads the table's current metadata file twice (the step's check, then the
SQL catalog's commit re-reads it) and the previous snapshot's manifest list
once, and asks for the size of the manifest it has just written: on a cloud
store each of those is one or two round trips (HEAD, GET) in sequence.
Kept here, the files a process wrote or read before cost none the next time:
a dataset's commits run on its shard's owner, which wrote the table's
latest metadata itself when it committed the dataset's previous job.

Within a commit, the manifests and the manifest list are written in the
background (:class:`WriteBatch`, :meth:`TableFileIO.deferring`): kept in
memory when closed, so pyiceberg goes on at once (it asks the manifest's size
for the manifest list), and uploaded while it builds and writes the rest. The
commit waits for every one of them before the catalog's pointer moves (the SQL
catalog after writing the new metadata file, so all three are uploaded at
once; other catalogs before their commit), so a table never points at a file
that is not in the store. A failed upload fails the commit and is forgotten
from memory.

Only what a name can settle is answered from memory (content, size, and
existence of a file seen; a new metadata file's name carries a fresh random
UUID, so it is written without asking first whether it exists); everything
else goes to the store: the catalog's
pointer to the current metadata (the commit's point of truth) is never
kept, data files (Parquet) pass straight through, and a name not seen is
always asked for. At most :data:`MAX_FILE_BYTES` a file and
:data:`MAX_CACHE_BYTES` in all, least recently used first out.

:class:`TableFileIO` is set as the catalog's ``py-io-impl``; it wraps the
file IO pyiceberg would have used (``commitfleet.io-impl`` when one was
configured, else pyiceberg's choice for the location's scheme).
"""

from __future__ import annotations

import io
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream, load_file_io
from pyiceberg.typedef import EMPTY_DICT, Properties

from ._iceberg_props import INNER_IO_IMPL, PY_IO_IMPL
from ._sized_cache import SizedCache

MAX_FILE_BYTES: Final = 8 * 1024 * 1024
MAX_CACHE_BYTES: Final = 64 * 1024 * 1024
_METADATA_SUFFIXES: Final = (".metadata.json", ".avro")
_FRESH_NAME: Final = re.compile(
    r"/[0-9]{5,}-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.metadata\.json\Z"
)


_KEPT: SizedCache[bytes] = SizedCache(MAX_CACHE_BYTES, MAX_FILE_BYTES)
"""The process's bytes of metadata files by location."""


def kept_size(location: str) -> int | None:
    """Return the size of the metadata file at ``location`` when its bytes are kept, else None."""
    data = _KEPT.get(location)
    return None if data is None else len(data)


UPLOAD_THREADS: Final = 8
"""Threads uploading deferred metadata files, for the whole process."""
_UPLOADS = ThreadPoolExecutor(max_workers=UPLOAD_THREADS, thread_name_prefix="table-upload")


class WriteBatch:
    """The metadata files one commit writes in the background. Thread-safe (pyiceberg writes from a pool)."""

    def __init__(self) -> None:
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()

    def submit(self, upload: Callable[[], None]) -> None:
        """Start ``upload`` in the background; :meth:`wait` waits for it."""
        fut = _UPLOADS.submit(upload)
        with self._lock:
            self._pending.append(fut)

    def wait(self) -> None:
        """Return once every upload submitted so far has ended.

        Raises: the first failed upload's error (OSError or the store SDK's).
        Blocking; the uploads cannot be interrupted.
        """
        with self._lock:
            pending = list(self._pending)
        wait_all(pending)
        for fut in pending:
            fut.result()

    def settle(self) -> None:
        """Return once every upload has ended, raising nothing (for a commit already failing).

        A failed upload here is a file no table points at: the commit that wrote it
        is not landing, and its error is the one that propagates.
        """
        with self._lock:
            pending = list(self._pending)
        wait_all(pending)


def local_path(location: str) -> str | None:
    """Return the local file path of ``location`` (``file://`` or no scheme), or None for another store."""
    scheme, _, rest = location.partition("://")
    if not rest:
        return location  # a bare path: pyiceberg writes it to the local filesystem
    if scheme != "file":
        return None
    return unquote(urlsplit(location).path)


def make_durable(path: str) -> None:
    """fsync the file at ``path`` and the folder that names it, so both survive a power cut.

    pyiceberg's local file IO writes without fsync, and the SQL catalog's
    commit is durable: after a power cut the catalog could point at a
    metadata file that was never on disk (the fleet's own store fsyncs every
    object it writes, :mod:`shared.storage`). The folders above it were made
    by the file IO without fsync too: the first time a process writes into a
    folder, every folder above it is fsynced as well (``_DURABLE_FOLDERS``).

    Raises: OSError (the write's failure: the commit fails and is retried).
    """
    _fsync(path)
    folder = os.path.dirname(path)
    _fsync(folder, os.O_DIRECTORY)
    if folder not in _DURABLE_FOLDERS:
        # The names of the folders above, once per process and folder (the file IO made them with the
        # table, without fsync): each is in the folder above it.
        above = os.path.dirname(folder)
        while above and above != os.path.dirname(above):
            _fsync(above, os.O_DIRECTORY)
            above = os.path.dirname(above)
        _DURABLE_FOLDERS.add(folder)


_DURABLE_FOLDERS: set[str] = set()
"""Metadata folders whose own names this process has made durable (one per table: bounded by tables)."""


def _fsync(path: str, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_metadata(location: str) -> bool:
    return location.endswith(_METADATA_SUFFIXES)


class _KeptInput(InputFile):
    """A metadata file to read: from memory when seen, else read whole once and kept."""

    def __init__(self, inner: InputFile) -> None:
        super().__init__(inner.location)
        self._inner = inner

    def _bytes(self) -> bytes:
        data = _KEPT.get(self.location)
        if data is None:
            with self._inner.open() as stream:
                data = bytes(stream.read())
            _KEPT.put(self.location, data, len(data))
        return data

    def __len__(self) -> int:
        data = _KEPT.get(self.location)
        return len(data) if data is not None else len(self._inner)

    def exists(self) -> bool:
        return _KEPT.get(self.location) is not None or self._inner.exists()

    def open(self, seekable: bool = True) -> InputStream:
        del seekable  # an in-memory stream is seekable
        return io.BytesIO(self._bytes())


class _KeepOnClose(io.BytesIO):
    """The bytes of a metadata file being written; on close, written through (or deferred) and kept."""

    def __init__(self, target: OutputFile, *, overwrite: bool, batch: WriteBatch | None) -> None:
        super().__init__()
        self._target = target
        self._overwrite = overwrite
        self._batch = batch

    def _upload(self, data: bytes) -> None:
        with self._target.create(overwrite=self._overwrite) as stream:
            stream.write(data)
        path = local_path(self._target.location)
        if path is not None:
            make_durable(path)

    def close(self) -> None:
        if self.closed:
            return
        data = self.getvalue()
        super().close()
        location = self._target.location
        if self._batch is None or len(data) > MAX_FILE_BYTES:
            # Not deferred (a file too big to keep would be asked from the store before it is there).
            self._upload(data)
            _KEPT.put(location, data, len(data))
            return
        _KEPT.put(location, data, len(data))  # pyiceberg asks the manifest's size right away

        def upload() -> None:
            try:
                self._upload(data)
            except BaseException:
                _KEPT.forget(location)  # never answer for a file that is not in the store
                raise

        self._batch.submit(upload)


class _KeptOutput(OutputFile):
    """A metadata file to write: written through on close, then kept."""

    def __init__(self, inner: OutputFile, batch: WriteBatch | None) -> None:
        super().__init__(inner.location)
        self._inner = inner
        self._batch = batch

    def __len__(self) -> int:
        data = _KEPT.get(self.location)
        return len(data) if data is not None else len(self._inner)

    def exists(self) -> bool:
        return _KEPT.get(self.location) is not None or self._inner.exists()

    def to_input_file(self) -> InputFile:
        return _KeptInput(self._inner.to_input_file())

    def create(self, overwrite: bool = False) -> OutputStream:
        # A name that carries a fresh random UUID (pyiceberg's metadata files: <version>-<uuid>.metadata.json)
        # cannot exist yet: asking the store (a HEAD, one more round trip before the commit) guards nothing.
        if not overwrite and not _FRESH_NAME.search(self.location) and self.exists():
            raise FileExistsError(f"Cannot create file, already exists: {self.location}")
        # Checked above; the write itself replaces (pyiceberg's local IO would check again).
        stream: Any = _KeepOnClose(self._inner, overwrite=True, batch=self._batch)
        return stream  # type: ignore[no-any-return]


class TableFileIO(FileIO):
    """pyiceberg file IO that keeps the table's metadata files it writes or reads (see the module doc)."""

    def __init__(self, properties: Properties = EMPTY_DICT) -> None:
        super().__init__(properties)
        self._inner: dict[str, FileIO] = {}
        self._lock = threading.Lock()
        self._batch: WriteBatch | None = None
        self._metadata_too = False

    def deferring(self, batch: WriteBatch, *, metadata_too: bool = False) -> TableFileIO:
        """Return this file IO writing its manifests and manifest lists in the background into ``batch``.

        New metadata files (``*.metadata.json``) are still written through at
        once, unless ``metadata_too``: for a caller that waits for ``batch``
        before any catalog points at the file (the lean commit, :mod:`._sql_catalog`).
        """
        other = TableFileIO(self.properties)
        other._inner, other._lock, other._batch = self._inner, self._lock, batch
        other._metadata_too = metadata_too
        return other

    def _io(self, location: str) -> FileIO:
        scheme = location.partition("://")[0] if "://" in location else ""
        with self._lock:
            found = self._inner.get(scheme)
            if found is None:
                props = {k: v for k, v in self.properties.items() if k not in (PY_IO_IMPL, INNER_IO_IMPL)}
                if impl := self.properties.get(INNER_IO_IMPL):
                    props[PY_IO_IMPL] = impl
                found = load_file_io(props, location)
                self._inner[scheme] = found
            return found

    def new_input(self, location: str) -> InputFile:
        """Return the file to read at ``location`` (a metadata file: kept once read)."""
        inner = self._io(location).new_input(location)
        return _KeptInput(inner) if _is_metadata(location) else inner

    def new_output(self, location: str) -> OutputFile:
        """Return the file to write at ``location`` (a metadata file: kept once written)."""
        inner = self._io(location).new_output(location)
        if not _is_metadata(location):
            return inner
        deferred = self._metadata_too or location.endswith(".avro")
        return _KeptOutput(inner, self._batch if deferred else None)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        """Delete the file at ``location``, from memory too."""
        where = location if isinstance(location, str) else location.location
        _KEPT.forget(where)
        self._io(where).delete(location)


__all__ = [
    "MAX_CACHE_BYTES",
    "MAX_FILE_BYTES",
    "UPLOAD_THREADS",
    "TableFileIO",
    "WriteBatch",
    "kept_size",
    "local_path",
    "make_durable",
]
