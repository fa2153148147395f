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

All blocking work runs in worker threads; cancellation abandons the await but
the thread finishes its (atomic) operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import shutil
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import BinaryIO, TypeVar

from .._errors import BadInput, ConfigError, NotFound, PreconditionFailed, TransientError
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
        self._meta = root / RESERVED_TOP
        # Our own pool: the event loop's default one has only cpu+4 threads,
        # too few when many commits write at once.
        self._pool: ThreadPoolExecutor | None = None
        try:
            (self._meta / "tmp").mkdir(parents=True, exist_ok=True)
            (self._meta / "stripes").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create local store at {root}: {exc}") from exc

    @property
    def url(self) -> str:
        return self._url

    @property
    def root(self) -> Path:
        """The directory holding the objects."""
        return self._root

    # -- helpers (run in threads) -------------------------------------------------

    def _path(self, key: str) -> Path:
        return self._root / check_key(key)

    @contextlib.contextmanager
    def _stripe(self, key: str) -> Iterator[None]:
        n = zlib.crc32(key.encode()) % _STRIPES
        fd = os.open(self._meta / "stripes" / f"{n:03x}.lock", os.O_RDWR | os.O_CREAT, 0o644)
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

    def _tmp_from(self, fill: _Filler) -> Path:
        tmp = self._meta / "tmp" / f"{os.getpid()}-{secrets.token_hex(8)}"
        try:
            with open(tmp, "wb") as fh:
                fill(fh)
                fh.flush()
                if self._durable:
                    os.fsync(fh.fileno())
            stamp = time.time_ns() + secrets.randbelow(1_000_000)
            os.utime(tmp, ns=(stamp, stamp))
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return tmp

    def _install(self, tmp: Path, dst: Path) -> os.stat_result:
        # A concurrent delete may prune the (empty) parent between makedirs and
        # rename; retrying makedirs is enough.
        for _ in range(20):
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, dst)
            except FileNotFoundError:
                continue
            except IsADirectoryError as exc:
                raise BadInput(f"object key names a folder: {dst}") from exc
            return os.stat(dst)
        raise TransientError(f"could not create parent folder of {dst}")

    def _put(self, key: str, fill: _Filler, *, absent: bool, version: str | None) -> ObjectInfo:
        dst = self._path(key)
        tmp = self._tmp_from(fill)
        try:
            with self._stripe(key):
                if absent or version is not None:
                    try:
                        cur: os.stat_result | None = os.stat(dst)
                    except FileNotFoundError:
                        cur = None
                    if absent and cur is not None:
                        raise PreconditionFailed(f"{key} already exists")
                    if version is not None and (cur is None or _version(cur) != version):
                        raise PreconditionFailed(f"{key} is not at version {version}")
                st = self._install(tmp, dst)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if self._durable:
            # After the stripe is released: the rename is already atomic and
            # visible; this makes it survive a power cut.
            self._sync_dir(dst.parent)
        return _info(key, st)

    @staticmethod
    def _sync_dir(path: Path) -> None:
        try:
            dfd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return  # pruned by a concurrent delete: nothing left to make durable
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _read(self, key: str) -> ObjectData:
        path = self._path(key)
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                data = fh.read()
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotFound(key) from exc
        except IsADirectoryError as exc:
            raise NotFound(key) from exc
        return ObjectData(info=_info(key, st), data=data)

    def _head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotFound(key) from exc
        if not os.path.isfile(path):
            raise NotFound(key)
        return _info(key, st)

    def _copy(self, src: str, dst: str) -> ObjectInfo:
        spath = self._path(src)
        try:
            fh = open(spath, "rb")  # noqa: SIM115 - closed below, passed to the filler
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise NotFound(src) from exc
        with fh:
            return self._put(
                dst, lambda out: shutil.copyfileobj(fh, out, _COPY_CHUNK), absent=False, version=None
            )

    def _delete(self, key: str) -> None:
        path = self._path(key)
        with self._stripe(key):
            try:
                path.unlink()
            except (FileNotFoundError, NotADirectoryError):
                return
            except IsADirectoryError:
                return
        parent = path.parent
        while parent != self._root:
            try:
                parent.rmdir()
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    break
                raise
            parent = parent.parent

    def _scan(self, prefix: str) -> list[ObjectInfo]:
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._root / base if base else self._root
        out: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(start):
            if Path(dirpath) == self._root:
                dirnames[:] = [d for d in dirnames if d != RESERVED_TOP]
            rel_dir = os.path.relpath(dirpath, self._root)
            for name in filenames:
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted while we walked
                out.append(_info(key, st))
        out.sort(key=lambda i: i.key)
        return out

    async def _run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="cf-local-store")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))

    # -- the port -----------------------------------------------------------------

    async def read(self, key: str) -> ObjectData:
        return await self._run(self._read, key)

    async def head(self, key: str) -> ObjectInfo:
        return await self._run(self._head, key)

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        return await self._run(self._put, key, _bytes_filler(data), absent=False, version=None)

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        return await self._run(self._put, key, _bytes_filler(data), absent=True, version=None)

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return await self._run(self._put, key, _bytes_filler(data), absent=False, version=version)

    async def delete(self, key: str) -> None:
        await self._run(self._delete, key)

    async def copy(self, src: str, dst: str) -> ObjectInfo:
        check_key(src)
        check_key(dst)
        return await self._run(self._copy, src, dst)

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


def _bytes_filler(data: bytes) -> _Filler:
    def fill(out: BinaryIO) -> None:
        out.write(data)

    return fill


def md5_hex(data: bytes) -> str:
    """Hex MD5 of ``data`` (used to compare against store checksums)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
