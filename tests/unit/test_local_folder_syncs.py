"""Folder fsyncs asked for at once share one fsync, and none returns before one that covers it.

The fsync is replaced by a recorder that can be held (an event), so the order of calls, tickets
and fsyncs is driven, not timed: callers that queue behind a running fsync are covered by the
next single one; no caller returns before an fsync that started after its call began has ended.
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
from pathlib import Path

import pytest

import shared.storage._local_sync as sync_mod
from shared.storage._local_sync import FolderSyncs

_DEADLINE_S = 10.0


class _Recorder:
    """Stands in for ``os`` in the module: fsyncs are logged (start, end) on one clock, and may be held."""

    def __init__(self) -> None:
        self.clock = itertools.count()
        self.lock = threading.Lock()
        self.fsyncs: list[tuple[int, int, int]] = []  # (inode, start, end)
        self.started = threading.Semaphore(0)
        self.release = threading.Event()
        self.hold = False
        self.fail_next = False

    def tick(self) -> int:
        with self.lock:
            return next(self.clock)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def fsync(self, fd: int) -> None:
        start = self.tick()
        self.started.release()
        if self.hold:
            assert self.release.wait(_DEADLINE_S)
        if self.fail_next:
            self.fail_next = False
            raise OSError(errno.EIO, "injected")
        self.fsyncs.append((os.fstat(fd).st_ino, start, self.tick()))


@pytest.fixture
def rec(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    r = _Recorder()
    monkeypatch.setattr(sync_mod, "os", r)
    return r


def _wait_for(cond: object, what: str) -> None:
    """Poll ``cond()`` until true (the threads' progress), failing after the deadline."""
    done = threading.Event()
    for _ in range(int(_DEADLINE_S / 0.001)):
        if cond():  # type: ignore[operator]
            return
        done.wait(0.001)
    raise AssertionError(f"timed out waiting for {what}")


def test_callers_queued_behind_a_running_fsync_share_the_next_one(tmp_path: Path, rec: _Recorder) -> None:
    syncs = FolderSyncs()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    spans: list[tuple[int, int]] = []

    def caller() -> None:
        begin = rec.tick()
        syncs.fsync(fd)
        spans.append((begin, rec.tick()))

    try:
        rec.hold = True
        first = threading.Thread(target=caller)
        first.start()
        assert rec.started.acquire(timeout=_DEADLINE_S)  # the first fsync runs, held
        others = [threading.Thread(target=caller) for _ in range(9)]
        for t in others:
            t.start()
        gate = next(iter(syncs._gates.values()))
        _wait_for(lambda: gate.asked == 10, "nine callers queued behind the first")
        rec.release.set()
        for t in [first, *others]:
            t.join(_DEADLINE_S)
    finally:
        os.close(fd)
    assert len(spans) == 10
    assert len(rec.fsyncs) == 2, rec.fsyncs  # the first, and one for the nine that waited
    for begin, end in spans:
        assert any(begin < start and stop < end for _, start, stop in rec.fsyncs), (begin, end, rec.fsyncs)
    assert syncs._gates == {}  # nothing kept once no call is in progress


def test_one_caller_at_a_time_gets_its_own_fsync_each_time(tmp_path: Path, rec: _Recorder) -> None:
    syncs = FolderSyncs()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(3):
            syncs.fsync(fd)
    finally:
        os.close(fd)
    assert len(rec.fsyncs) == 3


def test_folders_do_not_share_and_a_failed_fsync_is_not_counted_as_done(
    tmp_path: Path, rec: _Recorder
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    syncs = FolderSyncs()
    fa = os.open(tmp_path / "a", os.O_RDONLY | os.O_DIRECTORY)
    fb = os.open(tmp_path / "b", os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncs.fsync(fa)
        syncs.fsync(fb)
        assert [ino for ino, _, _ in rec.fsyncs] == [os.fstat(fa).st_ino, os.fstat(fb).st_ino]
        rec.fail_next = True
        with pytest.raises(OSError, match="injected"):
            syncs.fsync(fa)
        syncs.fsync(fa)  # not covered by the failed one: it runs its own
        assert len(rec.fsyncs) == 3
    finally:
        os.close(fa)
        os.close(fb)
    assert syncs._gates == {}
