"""Folder fsyncs shared by the writes that need them at the same time (a group commit).

A durable write renames its file into the key's folder, then fsyncs that
folder so the new name survives a power cut. Ten files published into one
dataset folder at once asked for ten fsyncs of the same folder, one after
another, though any fsync that starts after a rename makes that rename
durable. Here a write that finds an fsync of its folder already running waits
for it to end and then, unless an fsync that started after its own rename has
ended meanwhile, runs the next one for every write that waited with it.

The guarantee a caller gets is unchanged: when :meth:`FolderSyncs.fsync`
returns, an fsync of the folder that started after the call began (so after
the caller's rename) has completed. Only callers in one process share; other
processes make their own fsyncs, as before.
"""

from __future__ import annotations

import os
import threading


class _Gate:
    """One folder's state: tickets handed out, the last ticket covered, and the fsync's turn."""

    __slots__ = ("asked", "covered", "turn", "users")

    def __init__(self) -> None:
        self.asked = 0  # tickets handed out, one per call, in order
        self.covered = 0  # every ticket up to this one is covered by a completed fsync
        self.turn = threading.Lock()  # held by the thread running this folder's fsync
        self.users = 0  # calls in progress (the gate is dropped when none is)


class FolderSyncs:
    """Fsyncs of folders, shared by the threads that ask for the same folder at once. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[tuple[int, int], _Gate] = {}

    def fsync(self, fd: int) -> None:
        """Return once an fsync of ``fd``'s folder, started after this call began, has completed.

        Raises:
            OSError: from ``fstat`` or ``fsync`` (a waiter whose turn comes
                after a failed fsync runs its own and sees its own outcome).
        """
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            gate = self._gates.get(key)
            if gate is None:
                gate = self._gates[key] = _Gate()
            gate.users += 1
            gate.asked += 1
            ticket = gate.asked
        try:
            with gate.turn:
                if gate.covered >= ticket:
                    return  # an fsync that started after our ticket has completed
                with self._lock:
                    upto = gate.asked  # every ticket up to here was taken before this fsync starts
                os.fsync(fd)
                gate.covered = upto
        finally:
            with self._lock:
                gate.users -= 1
                if gate.users == 0:
                    del self._gates[key]


__all__ = ["FolderSyncs"]
