"""Local-files adapter: the embedded default store (``file:///abs/root``).

Guarantees, across processes on one host:

- Writes are atomic: bytes go to a temp file under ``<root>/.cf/tmp`` (same
  filesystem), are fsynced, then renamed over the key. A reader sees the old
  object or the new one, never half of one.
- Conditional writes (create-if-absent, compare-and-swap) check and rename
  while holding an exclusive ``flock`` on one of :data:`_STRIPES` lock files
  chosen by the key's hash, so two processes can never both win.
- The version is ``<inode>-<mtime_ns>`` of the file. Each write is a new inode
  (so it differs from the version it replaces while that one exists) and its
  mtime is stamped with the wall clock plus a random sub-millisecond offset, so
  a delete-then-recreate does not bring an old version back either.

- Symbolic links are never followed (see :mod:`._local_fs`): every key is
  reached folder by folder from the root with ``O_NOFOLLOW``. A link where a
  key's folder or object should be is refused (``LinkRefused``) by every
  method; ``list`` neither yields links nor descends into linked folders. No
  ``OSError`` escapes: each is mapped into the exception tree.

``.cf/`` under the root is the store's own area (never a key): ``tmp/`` for
the temp files of writes in progress (a killed writer may leave one; they are
never read) and ``stripes/`` for the 4096 ``flock`` files of conditional
writes.

All blocking work runs in worker threads; cancellation abandons the await but
the thread finishes its (atomic) operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import BinaryIO, TypeVar

from .._errors import (
    BadInput,
    CommitfleetError,
    ConfigError,
    LinkRefused,
    NotFound,
    PreconditionFailed,
    TransientError,
)
from ._local_fs import DIR_FLAGS, NEW_FILE_FLAGS, lstat_entry, open_file, os_error, prune_empty, walk
from ._port import RESERVED_TOP, ObjectData, ObjectInfo, StoreLifecycle, check_key, check_prefix

_STRIPES = 4096
# A stripe lock is held for a stat and a rename only (microseconds), but a
# holder can be frozen (SIGSTOP) inside it: then waiting forever would stall
# every process on that stripe, and the thread pool with it. Contenders poll
# for at most this long and then report a transient error instead.
_STRIPE_WAIT_S = 5.0
# Writes an object's bytes into an open temp file.
_Filler = Callable[[BinaryIO], None]
T = TypeVar("T")
_COPY_CHUNK = 1 << 20


def _version(st: os.stat_result) -> str:
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}"


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(key=key, size=st.st_size, version=_version(st), checksum=None)


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
        # Our own pool: the event loop's default one has only cpu+4 threads,
        # too few when many commits write at once.
        self._pool: ThreadPoolExecutor | None = None
        try:
            root.mkdir(parents=True, exist_ok=True)  # the configured root may itself lie behind links
            for area in ("tmp", "stripes"):
                with walk(root, [RESERVED_TOP, area], create=True, what="open the local store"):
                    pass
        except OSError as exc:
            raise ConfigError(f"cannot create local store at {root}: {exc}") from exc
        except CommitfleetError as exc:  # .cf/ is a link or a file: not a usable root
            raise ConfigError(f"cannot use local store at {root}: {exc}") from exc

    @property
    def url(self) -> str:
        return self._url

    @property
    def root(self) -> Path:
        """The directory holding the objects."""
        return self._root

    # -- helpers (run in threads; every path walked from the root, never through a link) ---------

    @contextlib.contextmanager
    def _stripe(self, key: str) -> Iterator[None]:
        n = zlib.crc32(key.encode()) % _STRIPES
        with walk(self._root, [RESERVED_TOP, "stripes"], create=True, what=f"lock stripe of {key}") as fds:
            fd = os.open(
                f"{n:03x}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fds[-1]
            )
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

    def _put(self, key: str, fill: _Filler, *, absent: bool, version: str | None) -> ObjectInfo:
        folders, name = _split(key)
        what = f"write {key}"
        with walk(self._root, [RESERVED_TOP, "tmp"], create=True, what=what) as tfds:
            tmpdir = tfds[-1]
            tmp = f"{os.getpid()}-{secrets.token_hex(8)}"
            fd = os.open(tmp, NEW_FILE_FLAGS, 0o644, dir_fd=tmpdir)
            installed = False
            try:
                with os.fdopen(fd, "wb", closefd=False) as fh:
                    fill(fh)
                    fh.flush()
                if self._durable:
                    os.fsync(fd)
                stamp = time.time_ns() + secrets.randbelow(1_000_000)
                os.utime(fd, ns=(stamp, stamp))
                st = os.fstat(fd)
                self._install(tmpdir, tmp, folders, name, key, absent=absent, version=version)
                installed = True
            finally:
                os.close(fd)
                if not installed:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=tmpdir)
        return _info(key, st)

    def _install(
        self,
        tmpdir: int,
        tmp: str,
        folders: list[str],
        name: str,
        key: str,
        *,
        absent: bool,
        version: str | None,
    ) -> None:
        what = f"write {key}"
        # A concurrent delete may prune an (empty) parent between making it
        # and the rename into it (ENOENT): walking again is enough.
        for _ in range(20):
            with walk(self._root, folders, create=True, what=what) as fds:
                parent = fds[-1]
                with self._stripe(key):
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

    def _open_object(self, key: str, what: str) -> tuple[int, os.stat_result]:
        folders, name = _split(key)
        with walk(self._root, folders, create=False, what=what, reading=True) as fds:
            return open_file(fds[-1], name, what)

    def _read(self, key: str) -> ObjectData:
        fd, st = self._open_object(key, f"read {key}")
        with os.fdopen(fd, "rb") as fh:
            data = fh.read()
        return ObjectData(info=_info(key, st), data=data)

    def _head(self, key: str) -> ObjectInfo:
        folders, name = _split(key)
        what = f"head {key}"
        with walk(self._root, folders, create=False, what=what, reading=True) as fds:
            st = lstat_entry(fds[-1], name, what)
        if st is None or stat.S_ISDIR(st.st_mode):
            raise NotFound(key)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{what}: not a regular file")
        return _info(key, st)

    def _head_md5(self, key: str) -> ObjectInfo:
        fd, st = self._open_object(key, f"checksum {key}")
        digest = hashlib.md5(usedforsecurity=False)
        with os.fdopen(fd, "rb") as fh:
            while chunk := fh.read(_COPY_CHUNK):
                digest.update(chunk)
        # The version and size are those of the bytes hashed (same descriptor).
        return ObjectInfo(key=key, size=st.st_size, version=_version(st), checksum=digest.hexdigest())

    def _copy(self, src: str, dst: str, pin: str | None) -> ObjectInfo:
        fd, st = self._open_object(src, f"copy {src}")
        if pin is not None and _version(st) != pin:
            os.close(fd)
            raise PreconditionFailed(f"copy {src}: the source is no longer at version {pin}")
        digest = hashlib.md5(usedforsecurity=False)

        def fill(out: BinaryIO) -> None:
            while chunk := fh.read(_COPY_CHUNK):
                digest.update(chunk)
                out.write(chunk)

        with os.fdopen(fd, "rb") as fh:
            info = self._put(dst, fill, absent=False, version=None)
        # The MD5 of the bytes copied, measured on the way: a copy's answer
        # says what was copied, like the cloud stores' copies do.
        return dataclasses.replace(info, checksum=digest.hexdigest())

    def _delete(self, key: str) -> None:
        folders, name = _split(key)
        what = f"delete {key}"
        try:
            with walk(self._root, folders, create=False, what=what, reading=True) as fds:
                with self._stripe(key):
                    st = lstat_entry(fds[-1], name, what)  # a link: LinkRefused, never removed
                    if st is None or stat.S_ISDIR(st.st_mode):
                        return
                    if not stat.S_ISREG(st.st_mode):
                        raise BadInput(f"{what}: not a regular file")
                    try:
                        os.unlink(name, dir_fd=fds[-1])
                    except FileNotFoundError:
                        return
                prune_empty(fds, folders)
        except NotFound:
            return  # a missing folder on the way: nothing to delete

    def _scan(self, prefix: str) -> list[ObjectInfo]:
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        out: list[ObjectInfo] = []
        try:
            with walk(
                self._root, base.split("/") if base else [], create=False, what=f"list {prefix}", reading=True
            ) as fds:
                self._scan_dir(fds[-1], base, prefix, out)
        except (NotFound, LinkRefused):
            return []  # no such folder, or a link: nothing of the store is listed through it
        out.sort(key=lambda i: i.key)
        return out

    def _scan_dir(self, fd: int, rel: str, prefix: str, out: list[ObjectInfo]) -> None:
        with os.scandir(fd) as it:
            entries = list(it)
        for entry in entries:
            if not rel and entry.name == RESERVED_TOP:
                continue
            key = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_symlink():
                    continue  # never listed, never descended into
                if entry.is_dir(follow_symlinks=False):
                    below = key + "/"
                    if below.startswith(prefix) or prefix.startswith(below):
                        self._scan_child(fd, entry.name, key, prefix, out)
                elif entry.is_file(follow_symlinks=False) and key.startswith(prefix):
                    out.append(_info(key, entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue  # deleted while we walked

    def _scan_child(self, parent: int, name: str, key: str, prefix: str, out: list[ObjectInfo]) -> None:
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return  # gone, or swapped for a link or a file since the scan: not descended into
            raise
        try:
            self._scan_dir(fd, key, prefix, out)
        finally:
            os.close(fd)

    async def _run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="cf-local-store")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(_guarded, fn, *args, **kwargs))

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
            # Running operations finish (each is atomic); nothing new starts.
            pool.shutdown(wait=False)


def _split(key: str) -> tuple[list[str], str]:
    parts = check_key(key).split("/")
    return parts[:-1], parts[-1]


def _guarded(fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """Run ``fn``; an ``OSError`` it lets out is mapped into the exception tree (none escapes raw)."""
    try:
        return fn(*args, **kwargs)
    except OSError as exc:
        raise os_error(exc, getattr(fn, "__name__", "local store").lstrip("_")) from exc


def _bytes_filler(data: bytes) -> _Filler:
    def fill(out: BinaryIO) -> None:
        out.write(data)

    return fill


def md5_hex(data: bytes) -> str:
    """Hex MD5 of ``data`` (used to compare against store checksums)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
