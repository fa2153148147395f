"""How the local store reaches what lies below its root: one ``openat2`` call, else the walk.

The root folder is opened once, on the store's first operation, and held
until :meth:`Tree.close` (the one path the kernel resolves as the operator
configured it; the store then keeps using the folder it opened even if that
path is later moved). Every key is resolved relative to that descriptor.

Fast path: Linux's ``openat2(2)`` (5.6 and later) with ``RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`` opens a key's folder or file in
one call. The kernel applies the walk's rule itself, atomically: a symbolic
link anywhere on the path, the last name included, fails the call (``ELOOP``)
and nothing may resolve outside the root (``EXDEV``). Only a success is taken
from it, and ``ENOENT`` where nothing is to be made (a reader's missing
object: ``NotFound``, what the walk would say). On any other failure the walk
runs (:func:`._local_fs.walk`): it makes a write's missing folders and says
exactly what is in the way (``LinkRefused``, a file where a folder should
be...), so every error is the walk's whichever path is taken.

Slow path: where ``openat2`` is missing (another system or architecture, a
kernel before 5.6, a seccomp filter answering ``ENOSYS`` or ``EPERM``: probed
once, when the root is opened) every call takes the walk, one ``O_NOFOLLOW``
open per folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .._errors import CommitfleetError, NotFound
from ._local_fs import DIR_FLAGS, lstat_entry, open_root, os_error, prune_empty, walk

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
# openat2 is 437 on every architecture that numbers new system calls alike
# (since Linux 5.1); elsewhere (alpha, ia64, mips) the walk is used.
_NR_OPENAT2 = 437
_SAME_NUMBER = frozenset(
    {"x86_64", "amd64", "i386", "i686", "aarch64", "arm64", "armv7l", "armv6l"}
    | {"riscv64", "ppc64le", "ppc64", "s390x", "loongarch64"}
)
# The probe's answers that mean "no openat2 here" rather than a failing store.
# An O_PATH descriptor opens nothing (no FIFO blocks, no device wakes): only fstat is asked of it.
_PATH_FLAGS = os.O_PATH | os.O_CLOEXEC
_UNAVAILABLE = frozenset({errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG, errno.EOPNOTSUPP})

OpenAt2 = Callable[[int, str, int, int], int]


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


def _bind() -> OpenAt2 | None:
    """Return a caller of the ``openat2`` system call, or None where it cannot be called."""
    if not sys.platform.startswith("linux") or platform.machine() not in _SAME_NUMBER:
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    how_p = ctypes.POINTER(_OpenHow)
    syscall.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p, how_p, ctypes.c_size_t)
    size = ctypes.sizeof(_OpenHow)

    def call(dir_fd: int, path: str, flags: int, mode: int) -> int:
        how = _OpenHow(flags, mode, _RESOLVE)
        fd = int(syscall(_NR_OPENAT2, dir_fd, os.fsencode(path), ctypes.byref(how), size))
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        return fd

    return call


# Looked up at each call (not captured), so that tests can replace it.
openat2: OpenAt2 | None = _bind()


def _probe(root_fd: int) -> bool:
    """Return whether ``openat2`` works here (one call: the root's own ``.``).

    Raises:
        CommitfleetError: it fails for a reason that is not its absence (mapped as :func:`os_error` says).
    """
    call = openat2
    if call is None:
        return False
    try:
        fd = call(root_fd, ".", DIR_FLAGS, 0)
    except OSError as exc:
        if exc.errno in _UNAVAILABLE:
            return False
        raise os_error(exc, "open the local store") from exc
    os.close(fd)
    return True


class Tree:
    """The store's root folder, held open while the store is used, and the ways to reach below it.

    Thread-safe: each operation holds the root (:meth:`held`) while it runs,
    and :meth:`close` lets go of it only once no operation holds it.
    """

    def __init__(self, root: Path, *, durable: bool) -> None:
        self._root = root
        self._durable = durable
        self._lock = threading.Lock()
        self._fd = -1
        self._users = 0
        self._closing = False
        self.fast = False  # openat2 works here; decided when the root is opened

    @contextlib.contextmanager
    def held(self) -> Iterator[int]:
        """Yield the root's descriptor, opening it (and probing ``openat2``) on first use.

        Never read the descriptor itself as a folder (``scandir``): it is
        shared by every thread, and with it the read position.

        Raises (on entry):
            ConfigError: the root cannot be opened.
            CommitfleetError: the probe failed oddly (as :func:`os_error` says).
        """
        with self._lock:
            if self._fd < 0:
                fd = open_root(self._root)
                try:
                    self.fast = _probe(fd)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
            self._closing = False  # used again after close(): keep it
            self._users += 1
            fd = self._fd
        try:
            yield fd
        finally:
            with self._lock:
                self._users -= 1
                if self._closing and self._users == 0:
                    self._drop()

    def close(self) -> None:
        """Close the root's descriptor now, or when the last running operation lets go of it."""
        with self._lock:
            if self._users:
                self._closing = True
            elif self._fd >= 0:
                self._drop()

    def _drop(self) -> None:
        fd, self._fd = self._fd, -1
        self._closing = False
        with contextlib.suppress(OSError):  # a folder's descriptor holds nothing to lose
            os.close(fd)

    def __del__(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    @contextlib.contextmanager
    def folder(
        self, root_fd: int, folders: Sequence[str], *, what: str, create: bool = False, reading: bool = False
    ) -> Iterator[int]:
        """Yield a descriptor of the folder ``folders`` below the root (the root's own when empty).

        With ``create``, missing folders are made (and, for a durable store,
        each one's parent fsynced). ``reading``: a file where a folder should
        be means the object is missing (as :func:`walk`).

        Raises (on entry):
            NotFound: a folder is missing (and ``create`` is off).
            LinkRefused / BadInput / ConfigError / TransientError: as :func:`walk`.
        """
        if not folders:
            yield root_fd
            return
        if self.fast:
            path = "/".join(folders)
            try:
                fd = _openat2(root_fd, path, DIR_FLAGS, 0)
            except OSError as exc:
                if exc.errno == errno.ENOENT and not create:
                    raise NotFound(f"{what}: folder {path!r} does not exist") from exc
            else:
                try:
                    yield fd
                finally:
                    os.close(fd)
                return
        with walk(
            root_fd, folders, create=create, what=what, reading=reading, durable=create and self._durable
        ) as fds:
            yield fds[-1]

    def open_at(
        self,
        root_fd: int,
        folders: Sequence[str],
        name: str,
        flags: int,
        mode: int = 0,
        *,
        what: str,
        create: bool = False,
        reading: bool = False,
    ) -> int:
        """Return a descriptor of ``name`` in the folder ``folders``, opened with ``flags``.

        ``flags`` must hold ``O_NOFOLLOW`` (the walk's last open needs it;
        ``openat2`` refuses a link as the last name anyway). ``create`` and
        ``reading``: as :meth:`folder` (``O_CREAT`` in ``flags`` makes the file).

        Raises:
            NotFound: missing (object or folder).
            LinkRefused: a symbolic link on the way or as ``name``.
            BadInput / ConfigError / TransientError: as :func:`os_error` and :func:`walk` say.
        """
        if self.fast:
            try:
                return _openat2(root_fd, "/".join([*folders, name]), flags, mode)
            except OSError as exc:
                if exc.errno == errno.ENOENT and not create:
                    raise NotFound(f"{what}: {exc.strerror}") from exc
        with walk(
            root_fd, folders, create=create, what=what, reading=reading, durable=create and self._durable
        ) as fds:
            try:
                return os.open(name, flags, mode, dir_fd=fds[-1])
            except OSError as exc:
                raise os_error(exc, what) from exc

    def lstat_at(
        self, root_fd: int, folders: Sequence[str], name: str, *, what: str
    ) -> os.stat_result | None:
        """Return the ``lstat`` of ``name`` in the folder ``folders``, or None when it does not exist.

        Raises:
            NotFound: a folder on the way is missing, or a file.
            LinkRefused: a symbolic link on the way or as ``name``.
            BadInput / ConfigError / TransientError: as :func:`os_error` and :func:`walk` say.
        """
        if self.fast:
            try:
                fd = _openat2(root_fd, "/".join([*folders, name]), _PATH_FLAGS, 0)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return None
            else:
                try:
                    return os.fstat(fd)
                finally:
                    os.close(fd)
        with walk(root_fd, folders, create=False, what=what, reading=True) as fds:
            return lstat_entry(fds[-1], name, what)

    def prune(self, root_fd: int, folders: Sequence[str]) -> None:
        """Remove ``folders`` from the deepest up while they are empty (best effort, never through a link)."""
        if not folders:
            return
        if not self.fast:
            # The object is deleted whatever happens here: a folder gone, or a link now, ends the pruning.
            with (
                contextlib.suppress(CommitfleetError),
                walk(root_fd, folders[:-1], create=False, what="prune", reading=True) as fds,
            ):
                prune_empty(fds, folders)
            return
        for depth in range(len(folders) - 1, -1, -1):
            try:
                holder = _openat2(root_fd, "/".join(folders[:depth]), DIR_FLAGS, 0) if depth else root_fd
            except OSError:
                return  # gone, or a link now: not ours to remove
            try:
                os.rmdir(folders[depth], dir_fd=holder)
            except OSError:
                return  # not empty (the usual end), gone, a link or a file: stop here
            finally:
                if depth:
                    os.close(holder)


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int:
    call = openat2
    if call is None:  # taken away after the probe (tests): answer as an old kernel does
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), path)
    return call(dir_fd, path, flags, mode)


__all__ = ["RESOLVE_BENEATH", "RESOLVE_NO_MAGICLINKS", "RESOLVE_NO_SYMLINKS", "Tree", "openat2"]
