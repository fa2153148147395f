"""Which files and folders the local store fsyncs, in order (inode numbers), on real files."""

from __future__ import annotations

import os

import pytest

import shared.storage._local as local_mod
import shared.storage._local_fs as fs_mod
import shared.storage._local_put as put_mod
import shared.storage._local_sync as sync_mod
import shared.storage._local_tree as tree_mod


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Return a list that gets the inode of each file or folder the local store fsyncs from now on.

    Each fsync still runs; only the store's modules see the recorder (``os`` in
    them is replaced by a stand-in whose ``fsync`` records first).
    """
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    class Os:
        def __getattr__(self, name: str) -> object:
            return fsync if name == "fsync" else getattr(os, name)

    for mod in (local_mod, fs_mod, tree_mod, put_mod, sync_mod):
        monkeypatch.setattr(mod, "os", Os())
    return synced
