"""Local-files adapter: the embedded default store (``file:///abs/root``).

Guarantees, across processes on one host:

- Writes are atomic: bytes go to a temp file under ``<root>/.cf/tmp`` (same
  filesystem), are fsynced, then renamed over the key. A reader sees the old
  object or the new one, never half of one.
- Conditional writes (create-if-absent, compare-and-swap) check and rename
  while holding an exclusive ``flock`` on one of :data:`~._local_put.STRIPES` lock files
  chosen by the key's hash, so two processes can never both win. Every write
  and delete holds its key's stripe, so they are linearizable with each other.
- The version is ``<inode>-<mtime_ns>`` of the file. Each write is a new inode
  (so it differs from the version it replaces while that one exists) and its
  mtime is stamped with the wall clock plus a random sub-millisecond offset, so
  a delete-then-recreate does not bring an old version back either.
- A copy is a hard link to its source's file where one can be made (see
  :mod:`._local_put`): no bytes are written, and the copy has its source's
  version (the same file; copying that source again after deleting the copy
  brings that version back, with the same bytes). Files are never changed in
  place, so the copy keeps its bytes when the source is written again or
  deleted. Where no link can be made or should be (a source owned by
  another user, with another name, or with set-id, sticky or execute bits;
  another file system mounted below the root, one without links) the bytes
  are copied into a new file like a write.

- Symbolic links are never followed (see :mod:`._local_tree` and
  :mod:`._local_fs`): every key is resolved from the root's descriptor by
  ``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` where Linux has
  it, else folder by folder with ``O_NOFOLLOW``; the last name is met with
  ``O_NOFOLLOW`` opens, ``lstat``, ``renameat`` and ``unlinkat``. A link where a
  key's folder or object should be is refused (``LinkRefused``) by every
  method; ``list`` neither yields links nor descends into linked folders. No
  ``OSError`` escapes: each is mapped into the exception tree.

Durability (``durable=True``, the default): what a write returned survives a
power cut, with exactly these fsyncs and no others:

1. The temp file, after its bytes and its mtime stamp (the version) and before
   the rename: without it the rename can reach the disk before the data, and
   the key would name an empty or partial file after a crash. The stamp is
   set before this fsync so that the version read back after a crash is the
   one the write returned.
2. The key's folder, after the rename: the rename is a change of that folder;
   until it is written the old object (or none) could come back.
3. The parent of each folder a write had to make, when it made it: the new
   folder's name is a change of its parent, which (2) does not write.

A copy made as a link fsyncs its source's file before the link (1: its
writer may not have), then its folder (2). Writes into one folder at the same
time share the folder's fsync (2): one that starts after a write's rename
covers it (:mod:`._local_sync`).

Not fsynced, on purpose: ``.cf/tmp`` (a temp name need not survive: at worst a
stale temp file, which is never read, is left behind), the lock stripes (they
hold no data; a lock lives only as long as the process holding it) and the
stripe folder. A delete (and the pruning of emptied folders after it) is
atomic but not fsynced, as it never was: after a power cut a deleted object
may be back, as if the delete had not returned. Making it durable would take
one folder fsync per delete (11 more in a 10-file commit).

With ``durable=False`` (tests, benchmarks) no fsync is made at all.

``.cf/`` under the root is the store's own area (never a key): ``tmp/`` for
the temp files of writes in progress (a killed writer may leave one; they are
never read) and ``stripes/`` for the 4096 ``flock`` files of conditional
writes.

The root is opened on the first operation and its descriptor held until
:meth:`LocalStore.close` (after it, a new operation opens it again). All
blocking work runs in worker threads; cancellation abandons the await but the
thread finishes its (atomic) operation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from .._errors import (
    BadInput,
    CommitfleetError,
    ConfigError,
    NotFound,
    PreconditionFailed,
)
from ._local_fs import READ_FLAGS, checked_file, lstat_entry, os_error
from ._local_pool import ThreadPool
from ._local_put import STRIPE_DIR, TMP, Filler, Puts, linkable, split_key
from ._local_scan import info_of as _info
from ._local_scan import scan
from ._local_scan import version_of as _version
from ._local_tree import Tree
from ._port import ObjectData, ObjectInfo, StoreLifecycle, check_key, check_prefix

T = TypeVar("T")
_COPY_CHUNK = 1 << 20
# The folder of the lock objects (``shared.locks.lock_key``): calls on them jump
# the threads' queue, so that a renewal or a release does not wait behind a
# backlog of file calls on a saturated disk.
URGENT_PREFIX = "_locks/"


class LocalStore(StoreLifecycle):
    """An :class:`~shared.storage.ObjectStore` over a local directory."""

    def __init__(
        self,
        root: Path,
        *,
        url: str | None = None,
        durable: bool = True,
        links: bool = True,
        threads: int = 4,
    ) -> None:
        """Open (and create) the store at ``root``; ``links=False`` makes every copy write its bytes.

        ``threads``: how many threads run the store's file calls (``store.local_threads``).

        Raises:
            ConfigError: ``root`` is not absolute or cannot be created.
        """
        if not root.is_absolute():
            raise ConfigError(f"local store root must be an absolute path: {root}")
        self._root = root
        self._url = url or root.as_uri()
        self._tree = Tree(root, durable=durable)
        self._puts = Puts(self._tree, durable=durable, links=links)
        # Our own pool (see _local_pool), small: with more threads than the disk
        # can keep busy, each file call's GIL handoffs cost more CPU than the
        # calls themselves (measured: docs/storage.md).
        self._threads = max(1, threads)
        self._pool: ThreadPool | None = None
        try:
            root.mkdir(parents=True, exist_ok=True)  # the configured root may itself lie behind links
            with self._tree.held() as root_fd:
                for area in (TMP, STRIPE_DIR):
                    with self._tree.folder(root_fd, area, what="open the local store", create=True):
                        pass
                self._puts.probe_links(root_fd)
        except OSError as exc:
            raise ConfigError(f"cannot create local store at {root}: {exc}") from exc
        except CommitfleetError as exc:  # .cf/ is a link or a file: not a usable root
            raise ConfigError(f"cannot use local store at {root}: {exc}") from exc
        finally:
            self._tree.close()  # opened again by the first operation: a store never used holds nothing

    @property
    def url(self) -> str:
        return self._url

    @property
    def root(self) -> Path:
        """The directory holding the objects."""
        return self._root

    # -- helpers (run in threads, given the root's descriptor; nothing reached through a link) ---

    def _open_object(self, root_fd: int, key: str, what: str) -> tuple[int, os.stat_result]:
        folders, name = split_key(key)
        fd = self._tree.open_at(root_fd, folders, name, READ_FLAGS, what=what, reading=True)
        return checked_file(fd, what)

    def _read(self, root_fd: int, key: str) -> ObjectData:
        fd, st = self._open_object(root_fd, key, f"read {key}")
        try:
            data = _read_all(fd, st.st_size)
        finally:
            os.close(fd)
        return ObjectData(info=_info(key, st), data=data)

    def _head(self, root_fd: int, key: str) -> ObjectInfo:
        folders, name = split_key(key)
        what = f"head {key}"
        st = self._tree.lstat_at(root_fd, folders, name, what=what)
        if st is None or stat.S_ISDIR(st.st_mode):
            raise NotFound(key)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{what}: not a regular file")
        return _info(key, st)

    def _head_md5(self, root_fd: int, key: str) -> ObjectInfo:
        fd, st = self._open_object(root_fd, key, f"checksum {key}")
        digest = hashlib.md5(usedforsecurity=False)
        try:
            while chunk := os.read(fd, _COPY_CHUNK):
                digest.update(chunk)
        finally:
            os.close(fd)
        # The version and size are those of the bytes hashed (same descriptor).
        return ObjectInfo(key=key, size=st.st_size, version=_version(st), checksum=digest.hexdigest())

    def _copy(self, root_fd: int, src: str, dst: str, pin: str | None) -> ObjectInfo:
        fd, st = self._open_object(root_fd, src, f"copy {src}")
        try:
            if pin is not None and _version(st) != pin:
                raise PreconditionFailed(f"copy {src}: the source is no longer at version {pin}")
            digest = hashlib.md5(usedforsecurity=False)
            if self._puts.links and linkable(st):
                while chunk := os.read(fd, _COPY_CHUNK):
                    digest.update(chunk)
                if self._puts.link(root_fd, fd, st, dst):
                    return dataclasses.replace(_info(dst, st), checksum=digest.hexdigest())
                os.lseek(fd, 0, os.SEEK_SET)
                digest = hashlib.md5(usedforsecurity=False)

            def fill(out: int) -> None:
                while chunk := os.read(fd, _COPY_CHUNK):
                    digest.update(chunk)
                    _write_all(out, chunk)

            info = self._puts.put(root_fd, dst, fill, absent=False, version=None)
        finally:
            os.close(fd)
        # The MD5 of the bytes copied, measured on the way: a copy's answer
        # says what was copied, like the cloud stores' copies do.
        return dataclasses.replace(info, checksum=digest.hexdigest())

    def _delete(self, root_fd: int, key: str) -> None:
        folders, name = split_key(key)
        what = f"delete {key}"
        try:
            with (
                self._tree.folder(root_fd, folders, what=what, reading=True) as parent,
                self._puts.stripe(root_fd, key),
            ):
                st = lstat_entry(parent, name, what)  # a link: LinkRefused, never removed
                if st is None or stat.S_ISDIR(st.st_mode):
                    return
                if not stat.S_ISREG(st.st_mode):
                    raise BadInput(f"{what}: not a regular file")
                try:
                    os.unlink(name, dir_fd=parent)
                except FileNotFoundError:
                    return
        except NotFound:
            return  # a missing folder on the way: nothing to delete
        self._tree.prune(root_fd, folders)

    def _scan(self, root_fd: int, prefix: str) -> list[ObjectInfo]:
        return scan(self._tree, root_fd, prefix)

    def _call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """Run ``fn(root_fd, ...)`` holding the root; an ``OSError`` it lets out is mapped into the tree."""
        try:
            with self._tree.held() as root_fd:
                return fn(root_fd, *args, **kwargs)
        except OSError as exc:
            raise os_error(exc, getattr(fn, "__name__", "local store").lstrip("_")) from exc

    async def _run(self, fn: Callable[..., T], key: str, *args: object, **kwargs: object) -> T:
        # A cancelled caller waits for its thread (see _local_pool), then goes on.
        if self._pool is None:
            # Again after close(): a closed store reopens.
            self._pool = ThreadPool(self._threads, "cf-local-store")
        call = partial(self._call, fn, key, *args, **kwargs)
        return await self._pool.run(call, urgent=key.startswith(URGENT_PREFIX))

    # -- the port -----------------------------------------------------------------

    async def read(self, key: str) -> ObjectData:
        return await self._run(self._read, key)

    async def head(self, key: str) -> ObjectInfo:
        return await self._run(self._head, key)

    async def head_md5(self, key: str) -> ObjectInfo:
        """Return the object's info with its MD5, computed by reading the file (no link followed)."""
        return await self._run(self._head_md5, key)

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        return await self._run(self._puts.put, key, _bytes_filler(data), absent=False, version=None)

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        return await self._run(self._puts.put, key, _bytes_filler(data), absent=True, version=None)

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return await self._run(self._puts.put, key, _bytes_filler(data), absent=False, version=version)

    async def delete(self, key: str) -> None:
        await self._run(self._delete, key)

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        check_key(src)
        check_key(dst)
        return await self._run(self._copy, src, dst, None if source is None else source.version)

    async def list(self, prefix: str = "", *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        check_prefix(prefix)
        items = await self._run(self._scan, prefix)
        for i in range(0, len(items), max(1, page_size)):
            for item in items[i : i + page_size]:
                yield item

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()  # running operations finish (each is atomic); their threads end then
        self._tree.close()  # at once, or when the last running operation ends


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int, size: int) -> bytes:
    """Return every byte left in ``fd``; ``size`` (its fstat) sizes the first read."""
    first = os.read(fd, size + 1)
    if not first:
        return b""
    parts = [first]
    while chunk := os.read(fd, _COPY_CHUNK):
        parts.append(chunk)
    return first if len(parts) == 1 else b"".join(parts)


def _bytes_filler(data: bytes) -> Filler:
    def fill(out: int) -> None:
        _write_all(out, data)

    return fill


def md5_hex(data: bytes) -> str:
    """Hex MD5 of ``data`` (used to compare against store checksums)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
