"""Local-files adapter: the embedded default store (``file:///abs/root``).

Guarantees, across processes on one host:

- Writes are atomic: bytes go to a temp file under ``<root>/.cf/tmp`` (same
  filesystem), are fsynced, then renamed over the key. A reader sees the old
  object or the new one, never half of one.
- Conditional writes (create-if-absent, compare-and-swap) check and rename
  while holding an exclusive ``flock`` on one of :data:`_STRIPES` lock files
  chosen by the key's hash, so two processes can never both win. Every write
  and delete holds its key's stripe, so they are linearizable with each other.
- The version is ``<inode>-<mtime_ns>`` of the file. Each write is a new inode
  (so it differs from the version it replaces while that one exists) and its
  mtime is stamped with the wall clock plus a random sub-millisecond offset, so
  a delete-then-recreate does not bring an old version back either.

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

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import secrets
import stat
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar

from .._errors import (
    BadInput,
    CommitfleetError,
    ConfigError,
    NotFound,
    PreconditionFailed,
    TransientError,
)
from ._local_fs import NEW_FILE_FLAGS, READ_FLAGS, checked_file, lstat_entry, os_error
from ._local_pool import ThreadPool
from ._local_scan import info_of as _info
from ._local_scan import scan
from ._local_scan import version_of as _version
from ._local_tree import Tree
from ._port import RESERVED_TOP, ObjectData, ObjectInfo, StoreLifecycle, check_key, check_prefix

_STRIPES = 4096
_TMP = (RESERVED_TOP, "tmp")
_STRIPE_DIR = (RESERVED_TOP, "stripes")
_STRIPE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
# A stripe lock is held for a stat and a rename only (microseconds), but a
# holder can be frozen (SIGSTOP) inside it: then waiting forever would stall
# every process on that stripe, and the thread pool with it. Contenders poll
# for at most this long and then report a transient error instead.
_STRIPE_WAIT_S = 5.0
# Writes an object's bytes into an open temp file (its descriptor).
_Filler = Callable[[int], None]
T = TypeVar("T")
_COPY_CHUNK = 1 << 20


class LocalStore(StoreLifecycle):
    """An :class:`~shared.storage.ObjectStore` over a local directory."""

    def __init__(self, root: Path, *, url: str | None = None, durable: bool = True) -> None:
        """Open (and create) the store at ``root``.

        Raises:
            ConfigError: ``root`` is not absolute or cannot be created.
        """
        if not root.is_absolute():
            raise ConfigError(f"local store root must be an absolute path: {root}")
        self._root = root
        self._url = url or root.as_uri()
        self._durable = durable
        self._tree = Tree(root, durable=durable)
        # Our own pool: the event loop's default one has only cpu+4 threads,
        # too few when many commits write at once.
        self._pool: ThreadPool | None = None
        try:
            root.mkdir(parents=True, exist_ok=True)  # the configured root may itself lie behind links
            with self._tree.held() as root_fd:
                for area in (_TMP, _STRIPE_DIR):
                    with self._tree.folder(root_fd, area, what="open the local store", create=True):
                        pass
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

    @contextlib.contextmanager
    def _stripe(self, root_fd: int, key: str) -> Iterator[None]:
        n = zlib.crc32(key.encode()) % _STRIPES
        what = f"lock stripe of {key}"
        name = f"{n:03x}.lock"
        fd = self._tree.open_at(root_fd, _STRIPE_DIR, name, _STRIPE_FLAGS, 0o644, what=what, create=True)
        try:
            deadline = time.monotonic() + _STRIPE_WAIT_S
            pause = 0.0005
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TransientError(f"local store: {key} stays locked by another process") from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.02)
            yield
        finally:
            os.close(fd)  # closing the descriptor drops the flock

    def _put(self, root_fd: int, key: str, fill: _Filler, *, absent: bool, version: str | None) -> ObjectInfo:
        folders, name = _split(key)
        what = f"write {key}"
        with self._tree.folder(root_fd, _TMP, what=what, create=True) as tmpdir:
            tmp = f"{os.getpid()}-{secrets.token_hex(8)}"
            fd = os.open(tmp, NEW_FILE_FLAGS, 0o644, dir_fd=tmpdir)
            installed = False
            try:
                fill(fd)
                stamp = time.time_ns() + secrets.randbelow(1_000_000)
                os.utime(fd, ns=(stamp, stamp))
                if self._durable:
                    os.fsync(fd)  # bytes and stamp on disk before the name points at them
                st = os.fstat(fd)
                self._install(root_fd, tmpdir, tmp, folders, name, key, absent=absent, version=version)
                installed = True
            finally:
                os.close(fd)
                if not installed:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=tmpdir)
        return _info(key, st)

    def _install(
        self,
        root_fd: int,
        tmpdir: int,
        tmp: str,
        folders: Sequence[str],
        name: str,
        key: str,
        *,
        absent: bool,
        version: str | None,
    ) -> None:
        what = f"write {key}"
        # A concurrent delete may prune an (empty) parent between making it
        # and the rename into it (ENOENT): resolving it again is enough.
        for _ in range(20):
            with self._tree.folder(root_fd, folders, what=what, create=True) as parent:
                with self._stripe(root_fd, key):
                    cur = lstat_entry(parent, name, what)  # a link: LinkRefused, never replaced
                    if cur is not None and not stat.S_ISREG(cur.st_mode):
                        raise BadInput(f"{what}: the key names a folder or a special file")
                    if absent and cur is not None:
                        raise PreconditionFailed(f"{key} already exists")
                    if version is not None and (cur is None or _version(cur) != version):
                        raise PreconditionFailed(f"{key} is not at version {version}")
                    try:
                        os.rename(tmp, name, src_dir_fd=tmpdir, dst_dir_fd=parent)
                    except FileNotFoundError:
                        continue
                if self._durable:
                    # After the stripe is released: the rename is already atomic
                    # and visible; this makes it survive a power cut.
                    os.fsync(parent)
                return
        raise TransientError(f"{what}: its folder keeps disappearing")

    def _open_object(self, root_fd: int, key: str, what: str) -> tuple[int, os.stat_result]:
        folders, name = _split(key)
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
        folders, name = _split(key)
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

            def fill(out: int) -> None:
                while chunk := os.read(fd, _COPY_CHUNK):
                    digest.update(chunk)
                    _write_all(out, chunk)

            info = self._put(root_fd, dst, fill, absent=False, version=None)
        finally:
            os.close(fd)
        # The MD5 of the bytes copied, measured on the way: a copy's answer
        # says what was copied, like the cloud stores' copies do.
        return dataclasses.replace(info, checksum=digest.hexdigest())

    def _delete(self, root_fd: int, key: str) -> None:
        folders, name = _split(key)
        what = f"delete {key}"
        try:
            with (
                self._tree.folder(root_fd, folders, what=what, reading=True) as parent,
                self._stripe(root_fd, key),
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

    async def _run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        # A cancelled caller waits for its thread (see _local_pool), then goes on.
        if self._pool is None:
            self._pool = ThreadPool(32, "cf-local-store")  # again after close(): a closed store reopens
        return await self._pool.run(partial(self._call, fn, *args, **kwargs))

    # -- the port -----------------------------------------------------------------

    async def read(self, key: str) -> ObjectData:
        return await self._run(self._read, key)

    async def head(self, key: str) -> ObjectInfo:
        return await self._run(self._head, key)

    async def head_md5(self, key: str) -> ObjectInfo:
        """Return the object's info with its MD5, computed by reading the file (no link followed)."""
        return await self._run(self._head_md5, key)

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        return await self._run(self._put, key, _bytes_filler(data), absent=False, version=None)

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        return await self._run(self._put, key, _bytes_filler(data), absent=True, version=None)

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return await self._run(self._put, key, _bytes_filler(data), absent=False, version=version)

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


def _split(key: str) -> tuple[list[str], str]:
    parts = check_key(key).split("/")
    return parts[:-1], parts[-1]


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


def _bytes_filler(data: bytes) -> _Filler:
    def fill(out: int) -> None:
        _write_all(out, data)

    return fill


def md5_hex(data: bytes) -> str:
    """Hex MD5 of ``data`` (used to compare against store checksums)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
