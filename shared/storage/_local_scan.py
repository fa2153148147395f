"""The local store's listing: every object below a prefix, never a link, never through one."""

from __future__ import annotations

import errno
import os

from .._errors import LinkRefused, NotFound
from ._local_fs import DIR_FLAGS
from ._local_tree import Tree
from ._port import RESERVED_TOP, ObjectInfo


def version_of(st: os.stat_result) -> str:
    """Return an object's version: ``<inode>-<mtime_ns>`` in hex (see :mod:`._local`)."""
    return f"{st.st_ino:x}-{st.st_mtime_ns:x}"


def info_of(key: str, st: os.stat_result) -> ObjectInfo:
    """Return what a listing or a head says of the object ``key`` with this ``lstat``/``fstat``."""
    return ObjectInfo(key=key, size=st.st_size, version=version_of(st), checksum=None)


def scan(tree: Tree, root_fd: int, prefix: str) -> list[ObjectInfo]:
    """Return every object whose key starts with ``prefix``, in key order (``.cf/`` left out).

    Links are neither listed nor descended into; a prefix whose folder is
    missing, a file or a link lists nothing.

    Raises:
        BadInput / ConfigError / TransientError: as :func:`._local_fs.os_error` says.
    """
    base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
    folders = base.split("/") if base else []
    out: list[ObjectInfo] = []
    try:
        with tree.folder(root_fd, folders, what=f"list {prefix}", reading=True) as fd:
            # The root's descriptor is shared by every thread, and a folder's read
            # position with it: list the root through a descriptor of our own.
            own = fd if folders else os.open(".", DIR_FLAGS, dir_fd=fd)
            try:
                _scan_dir(own, base, prefix, out)
            finally:
                if own != fd:
                    os.close(own)
    except (NotFound, LinkRefused):
        return []  # no such folder, or a link: nothing of the store is listed through it
    out.sort(key=lambda i: i.key)
    return out


def _scan_dir(fd: int, rel: str, prefix: str, out: list[ObjectInfo]) -> None:
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
                    _scan_child(fd, entry.name, key, prefix, out)
            elif entry.is_file(follow_symlinks=False) and key.startswith(prefix):
                out.append(info_of(key, entry.stat(follow_symlinks=False)))
        except FileNotFoundError:
            continue  # deleted while we walked


def _scan_child(parent: int, name: str, key: str, prefix: str, out: list[ObjectInfo]) -> None:
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return  # gone, or swapped for a link or a file since the scan: not descended into
        raise
    try:
        _scan_dir(fd, key, prefix, out)
    finally:
        os.close(fd)


__all__ = ["info_of", "scan", "version_of"]
