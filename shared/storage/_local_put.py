"""How the local store gives a key its new file: a temp file renamed in, or a hard link, under its stripe.

Every write and delete holds its key's stripe (an exclusive ``flock`` on one of
:data:`STRIPES` files chosen by the key's hash) while it checks the key and
changes it, so conditional writes are linearizable across processes. The
fsyncs a durable write makes are those the local store's module doc lists.

A copy (:meth:`Puts.link`) gives the destination the source's very file (a
hard link, no bytes written): the store never changes a file in place, each
write being a new file renamed over the key, so a link reads exactly as a copy
would, now and after the source is written again or deleted. Where a link
cannot be made (another file system mounted below the root, one without
links, too many links) or should not be (:func:`linkable`) the caller copies
the bytes instead.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import stat
import time
import zlib
from collections.abc import Callable, Iterator, Sequence

from .._errors import BadInput, NotFound, PreconditionFailed, TransientError
from .._nonce import nonce
from ._local_fs import NEW_FILE_FLAGS, lstat_entry
from ._local_scan import info_of, version_of
from ._local_sync import FolderSyncs
from ._local_tree import Tree
from ._port import RESERVED_TOP, ObjectInfo, check_key

STRIPES = 4096
TMP = (RESERVED_TOP, "tmp")
STRIPE_DIR = (RESERVED_TOP, "stripes")
_STRIPE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
# A stripe lock is held for a stat and a rename only (microseconds), but a
# holder can be frozen (SIGSTOP) inside it: then waiting forever would stall
# every process on that stripe, and the thread pool with it. Contenders poll
# for at most this long and then report a transient error instead.
_STRIPE_WAIT_S = 5.0
# Writes an object's bytes into an open temp file (its descriptor).
Filler = Callable[[int], None]
# Puts a new file at a name in an open folder, over what is there (its lstat, or None).
_Placer = Callable[[int, "os.stat_result | None"], None]
# A hard link cannot be made here: the copy writes the bytes instead.
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP})


class _SourceGone(Exception):
    """The file to link was deleted after it was opened (it can be copied, not linked)."""


def linkable(st: os.stat_result) -> bool:
    """Return True when a copy of this file may be a link to it rather than a new file.

    Only a file that is exactly what a byte copy would make: ours (a copy is
    owned by the worker's user), with no other name (a second name may lie
    outside the root: a file planted as a hard link to one there must not
    become a published object that *is* that file), and plain permissions (no
    set-id, sticky or execute bit: a copy is made ``0644``).
    """
    return st.st_uid == os.geteuid() and st.st_nlink == 1 and not stat.S_IMODE(st.st_mode) & 0o7111


def _temp_name() -> str:
    """Return a fresh name for a file in ``.cf/tmp`` (this process's id first: whose it was)."""
    return f"{os.getpid()}-{nonce()}"


def split_key(key: str) -> tuple[list[str], str]:
    """Return a key's folders and its last name (raises BadInput for a bad key)."""
    parts = check_key(key).split("/")
    return parts[:-1], parts[-1]


class Puts:
    """The write side of one local store (run in its threads, given the root's descriptor)."""

    def __init__(self, tree: Tree, *, durable: bool, links: bool) -> None:
        self._tree = tree
        self._durable = durable
        self.links = links  # decided by probe_links() when the store opens
        self._syncs = FolderSyncs()

    def probe_links(self, root_fd: int) -> None:
        """Keep links on only where a descriptor can be linked here (``/proc``, a file system with links)."""
        if not self.links:
            return
        with self._tree.folder(root_fd, TMP, what="open the local store", create=True) as tmpdir:
            name = _temp_name()
            fd = os.open(name, NEW_FILE_FLAGS, 0o644, dir_fd=tmpdir)
            try:
                os.link(f"/proc/self/fd/{fd}", f"{name}-link", dst_dir_fd=tmpdir, follow_symlinks=True)
                os.unlink(f"{name}-link", dir_fd=tmpdir)
            except OSError:
                self.links = False
            finally:
                os.close(fd)
                os.unlink(name, dir_fd=tmpdir)

    @contextlib.contextmanager
    def stripe(self, root_fd: int, key: str) -> Iterator[None]:
        """Hold ``key``'s stripe lock (every process on this host).

        Raises (on entry):
            TransientError: another process held it for :data:`_STRIPE_WAIT_S`.
        """
        n = zlib.crc32(key.encode()) % STRIPES
        what = f"lock stripe of {key}"
        name = f"{n:03x}.lock"
        try:
            # Without O_CREAT first: opening a file that exists then takes no
            # exclusive lock on the stripe folder, which every write shares.
            fd = self._tree.open_at(root_fd, STRIPE_DIR, name, _STRIPE_FLAGS & ~os.O_CREAT, what=what)
        except NotFound:
            fd = self._tree.open_at(root_fd, STRIPE_DIR, name, _STRIPE_FLAGS, 0o644, what=what, create=True)
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

    def put(self, root_fd: int, key: str, fill: Filler, *, absent: bool, version: str | None) -> ObjectInfo:
        """Write a new file through ``fill`` and rename it over ``key``; return its info.

        Raises:
            PreconditionFailed: ``absent`` and the key exists, or ``version``
                and the key is not at it (nothing changed).
            As :meth:`install`.
        """
        folders, name = split_key(key)
        what = f"write {key}"
        with self._tree.folder(root_fd, TMP, what=what, create=True) as tmpdir:
            tmp = _temp_name()
            fd = os.open(tmp, NEW_FILE_FLAGS, 0o644, dir_fd=tmpdir)
            installed = False
            try:
                fill(fd)
                stamp = time.time_ns() + random.randrange(1_000_000)
                os.utime(fd, ns=(stamp, stamp))
                if self._durable:
                    os.fsync(fd)  # bytes and stamp on disk before the name points at them
                st = os.fstat(fd)

                def place(parent: int, cur: os.stat_result | None) -> None:
                    os.rename(tmp, name, src_dir_fd=tmpdir, dst_dir_fd=parent)

                self.install(root_fd, folders, name, key, place, absent=absent, version=version)
                installed = True
            finally:
                os.close(fd)
                if not installed:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=tmpdir)
        return info_of(key, st)

    def link(self, root_fd: int, fd: int, source: os.stat_result, dst: str) -> bool:
        """Make ``dst`` name the open file ``fd`` (``source``: its fstat), replacing what is there.

        A link changes neither the file's size nor its version (inode and
        mtime): ``source`` describes ``dst`` afterwards.

        Returns:
            True when linked; False where no link can be made here, or the file
            was deleted since it was opened (nothing changed: the caller copies
            the bytes).

        Raises:
            As :meth:`install`.
        """
        folders, name = split_key(dst)
        me = f"/proc/self/fd/{fd}"

        def link_at(folder: int, to: str) -> None:
            try:
                os.link(me, to, dst_dir_fd=folder, follow_symlinks=True)
            except FileNotFoundError:
                if os.fstat(fd).st_nlink == 0:
                    raise _SourceGone from None  # deleted since it was opened: copy the bytes
                raise  # the folder was pruned meanwhile: install() resolves it again

        def place(parent: int, cur: os.stat_result | None) -> None:
            if cur is not None and (cur.st_dev, cur.st_ino) == (source.st_dev, source.st_ino):
                # A copy onto its own key: a rename onto another name of the same
                # file would do nothing and leave the temp name behind.
                return
            if cur is None:
                try:
                    link_at(parent, name)
                    return
                except FileExistsError:
                    pass  # made meanwhile by someone not holding the stripe: replace it like a write
            # Over an existing file: linked under a temp name, then renamed over it (atomic).
            with self._tree.folder(root_fd, TMP, what=f"copy to {dst}", create=True) as tmpdir:
                tmp = _temp_name()
                link_at(tmpdir, tmp)
                try:
                    os.rename(tmp, name, src_dir_fd=tmpdir, dst_dir_fd=parent)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=tmpdir)
                    raise

        if self._durable:
            # The bytes on disk before a new name points at them (the source's
            # writer may not have fsynced them; nothing to write if it did).
            os.fsync(fd)
        try:
            self.install(root_fd, folders, name, dst, place, absent=False, version=None)
        except _SourceGone:
            return False
        except OSError as exc:
            if exc.errno in _NO_LINK:
                return False
            raise
        return True

    def install(
        self,
        root_fd: int,
        folders: Sequence[str],
        name: str,
        key: str,
        place: _Placer,
        *,
        absent: bool,
        version: str | None,
    ) -> None:
        """Check ``key``'s preconditions and ``place`` its new file, holding its stripe; fsync its folder.

        ``place(parent, current)`` puts the file at ``name`` in ``parent`` (the
        key's folder, descriptor) over ``current`` (its lstat, or None).

        Raises:
            PreconditionFailed: as :meth:`put`.
            BadInput: the key names a folder or a special file.
            LinkRefused: a link where the key or one of its folders should be.
            TransientError: the key's folder kept disappearing, or its stripe stayed locked.
            OSError: from ``place`` (the store maps it at its boundary).
        """
        what = f"write {key}"
        # A concurrent delete may prune an (empty) parent between making it
        # and the rename into it (ENOENT): resolving it again is enough.
        for _ in range(20):
            with self._tree.folder(root_fd, folders, what=what, create=True) as parent:
                with self.stripe(root_fd, key):
                    cur = lstat_entry(parent, name, what)  # a link: LinkRefused, never replaced
                    if cur is not None and not stat.S_ISREG(cur.st_mode):
                        raise BadInput(f"{what}: the key names a folder or a special file")
                    if absent and cur is not None:
                        raise PreconditionFailed(f"{key} already exists")
                    if version is not None and (cur is None or version_of(cur) != version):
                        raise PreconditionFailed(f"{key} is not at version {version}")
                    try:
                        place(parent, cur)
                    except FileNotFoundError:
                        continue
                if self._durable:
                    # After the stripe is released: the rename is already atomic
                    # and visible; this makes it survive a power cut. Writes into
                    # one folder at once share an fsync (see _local_sync).
                    self._syncs.fsync(parent)
                return
        raise TransientError(f"{what}: its folder keeps disappearing")


__all__ = ["STRIPES", "STRIPE_DIR", "TMP", "Filler", "Puts", "linkable", "split_key"]
