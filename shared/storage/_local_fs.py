"""The local store's file-system primitives: the walk, one folder at a time, never through a link.

A key ``a/b/c`` is reached from the root's descriptor by opening ``a`` and
``b`` one at a time relative to the folder before (``openat`` with
``O_DIRECTORY | O_NOFOLLOW``), and acting on ``c`` relative to ``b``
(``O_NOFOLLOW`` opens, ``lstat``, ``renameat``, ``unlinkat``). The kernel then
never resolves a symbolic link inside the store: a link anywhere on the way is
met as ``ELOOP``/``ENOTDIR`` and refused (:class:`~shared._errors.LinkRefused`),
whatever another process changes meanwhile. Only the root path itself, which
the operator configured, is resolved by the kernel.

The walk is the local store's slow path: where Linux's ``openat2`` is there
(:mod:`._local_tree`), a whole path is resolved in one call under the same
rule, and the walk only runs to make missing folders and to say exactly what
is in the way when that call fails.

Every ``OSError`` is mapped into the exception tree here (:func:`os_error`);
none escapes the local store raw.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from .._errors import (
    BadInput,
    CommitfleetError,
    ConfigError,
    LinkRefused,
    NotFound,
    TransientError,
)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted in the store must not hang a thread.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# errno -> the member of the tree that says what a caller should do.
_CONFIG = {errno.EACCES, errno.EPERM, errno.EROFS, errno.EXDEV}
_BAD = {errno.ENAMETOOLONG, errno.EINVAL, errno.EISDIR, errno.ENOTDIR, errno.ENXIO, errno.EEXIST}


def os_error(exc: OSError, what: str) -> CommitfleetError:
    """Return the tree's error for ``exc`` raised while doing ``what``.

    ``ENOENT`` is NotFound; ``ELOOP`` (a link met with ``O_NOFOLLOW``) is
    LinkRefused; a name too long, a folder or a non-file where a file is
    expected (or the reverse) is BadInput; permission, read-only or
    cross-device problems are ConfigError (the deployment must change);
    everything else (disk full, I/O error, out of descriptors...) is
    TransientError.
    """
    code = exc.errno
    if code == errno.ENOENT:
        return NotFound(f"{what}: {exc.strerror}")
    if code == errno.ELOOP:
        return LinkRefused(f"{what}: a symbolic link is in the way (links are never followed)")
    if code in _BAD:
        return BadInput(f"{what}: {exc.strerror}")
    if code in _CONFIG:
        return ConfigError(f"{what}: {exc.strerror}")
    return TransientError(f"{what}: {type(exc).__name__}: {exc}")


def _refuse_link_or_file(parent: int, name: str, what: str, *, reading: bool) -> CommitfleetError:
    """Say why ``name`` in ``parent`` could not be opened as a folder."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError as exc:
        return os_error(exc, what)
    if stat.S_ISLNK(st.st_mode):
        return LinkRefused(f"{what}: {name!r} is a symbolic link (links are never followed)")
    if reading:
        # A file "a/b" means no object "a/b/c" can exist: for a reader it is simply missing.
        return NotFound(f"{what}: {name!r} is a file, not a folder")
    return BadInput(f"{what}: {name!r} is a file where a folder is expected")


def open_root(root: Path) -> int:
    """Return a descriptor of the store's root folder (the one path the kernel resolves).

    Raises:
        ConfigError: the root is gone, or not a readable folder.
    """
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"local store root {root} cannot be opened: {exc.strerror}") from exc


def open_dir(
    parent: int, name: str, *, create: bool, what: str, reading: bool = False, durable: bool = False
) -> int:
    """Return a descriptor of folder ``name`` inside ``parent``, never through a link.

    With ``create``, a missing folder is made (a concurrent maker is fine);
    with ``durable`` too, ``parent`` is then fsynced, so the new folder's name
    survives a power cut (the object later put in it is fsynced with its own
    folder, which does not make the folder's own name durable).

    Raises:
        NotFound: it does not exist (and ``create`` is off), or it is a file
            and ``reading`` (nothing can be below a file).
        LinkRefused: it is a symbolic link.
        BadInput: it is a file (writers), or the name is unusable.
        ConfigError / TransientError: as :func:`os_error` says.
    """
    for _ in range(20):
        try:
            return os.open(name, DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError as exc:
            if not create:
                raise NotFound(f"{what}: folder {name!r} does not exist") from exc
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refuse_link_or_file(parent, name, what, reading=reading) from exc
            raise os_error(exc, what) from exc
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            continue  # made by someone else meanwhile (or a link/file: the open says which)
        except FileNotFoundError as exc:
            # ``parent`` itself was pruned (emptied and removed by a delete) after we
            # opened it: nothing can be made in it; the walk starts again from the root.
            raise _ParentGone(f"{what}: folder above {name!r} was removed meanwhile") from exc
        except OSError as exc:
            raise os_error(exc, what) from exc
        if durable:
            os.fsync(parent)
    raise TransientError(f"{what}: folder {name!r} keeps changing")


class _ParentGone(TransientError):
    """A folder of a walk was removed under it; :func:`walk` starts again from the root."""


@contextlib.contextmanager
def walk(
    root_fd: int,
    folders: Sequence[str],
    *,
    create: bool,
    what: str,
    reading: bool = False,
    durable: bool = False,
) -> Iterator[list[int]]:
    """Yield descriptors of the root and of each of ``folders`` below it, in order; close them after.

    ``root_fd`` (the first one yielded) is the caller's: it is neither
    duplicated nor closed here. ``create`` and ``durable``: as :func:`open_dir`.

    Raises (on entry): as :func:`open_dir`.
    """
    fds: list[int] = []
    for _ in range(20):
        fds = [root_fd]
        try:
            for name in folders:
                fd = open_dir(fds[-1], name, create=create, what=what, reading=reading, durable=durable)
                fds.append(fd)
            break
        except _ParentGone:
            _close_all(fds)
        except BaseException:
            _close_all(fds)
            raise
    else:
        raise TransientError(f"{what}: folders keep being removed under the walk")
    try:
        yield fds
    finally:
        _close_all(fds)


def _close_all(fds: list[int]) -> None:
    """Close every descriptor of a walk but the first (the root's, which the caller owns)."""
    for fd in reversed(fds[1:]):
        os.close(fd)


def lstat_entry(parent: int, name: str, what: str) -> os.stat_result | None:
    """Return the ``lstat`` of ``name`` in ``parent``, or None when it does not exist.

    Raises:
        LinkRefused: it is a symbolic link.
        ConfigError / TransientError / BadInput: as :func:`os_error` says.
    """
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error(exc, what) from exc
    if stat.S_ISLNK(st.st_mode):
        raise LinkRefused(f"{what}: {name!r} is a symbolic link (links are never followed)")
    return st


def open_file(parent: int, name: str, what: str) -> tuple[int, os.stat_result]:
    """Open regular file ``name`` in ``parent`` for reading, never through a link.

    Returns:
        The descriptor (blocking mode) and its ``fstat``.

    Raises:
        NotFound: missing, or a folder (a prefix is not an object).
        LinkRefused: a symbolic link.
        BadInput: not a regular file (FIFO, socket, device).
    """
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise os_error(exc, what) from exc
    return checked_file(fd, what)


def checked_file(fd: int, what: str) -> tuple[int, os.stat_result]:
    """Return ``fd`` (opened with :data:`READ_FLAGS`) in blocking mode and its ``fstat``, if a regular file.

    Raises (after closing ``fd``):
        NotFound: a folder (a prefix is not an object).
        BadInput: not a regular file (FIFO, socket, device).
    """
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise NotFound(f"{what}: a folder, not an object")
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{what}: not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def prune_empty(fds: list[int], folders: Sequence[str]) -> None:
    """Remove ``folders`` from the deepest up while they are empty (best effort, never through a link).

    ``fds[i]`` is the descriptor of the folder holding ``folders[i]``.
    """
    for i in range(len(folders) - 1, -1, -1):
        try:
            os.rmdir(folders[i], dir_fd=fds[i])
        except OSError:
            # Not empty, gone already, replaced by a link or a file, not ours
            # to remove: the object is deleted either way; stop here.
            return


__all__ = [
    "DIR_FLAGS",
    "NEW_FILE_FLAGS",
    "READ_FLAGS",
    "checked_file",
    "lstat_entry",
    "open_dir",
    "open_file",
    "open_root",
    "os_error",
    "prune_empty",
    "walk",
]
