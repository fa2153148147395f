"""The storage lock across real processes on one local store: a killed holder, a frozen holder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.locks import StorageLock, read_lock
from shared.settings import LockSettings
from shared.storage._local import LocalStore
from tests._support.wait import wait_for, wait_for_sync

REPO = Path(__file__).resolve().parents[2]
SETTINGS = LockSettings(
    validity=1.5, renew_interval=0.4, max_drift=0.1, acquire_timeout=20, poll_min=0.01, poll_max=0.1
)
NAME = "ds1"


class Holder:
    """A ``lock_worker hold`` process holding the lock and writing markers while it does."""

    def __init__(self, root: Path, out: Path, owner: str) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.owner = owner
        cfg = {
            "mode": "hold",
            "root": str(root),
            "name": NAME,
            "owner": owner,
            "out": str(out),
            "settings": {f: getattr(SETTINGS, f) for f in SETTINGS.__struct_fields__},
        }
        with open(out / "stderr.txt", "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests._support.lock_worker", json.dumps(cfg)],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def held(self) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"holder exited early: {(self.out / 'stderr.txt').read_text()}")
            path = self.out / "held.json"
            return json.loads(path.read_text()) if path.exists() else None

        got = wait_for_sync(probe, timeout=30, what="the holder to take the lock")
        assert got is not None
        return got

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        # Resume first: a stopped process does not die of SIGKILL until it runs again on some kernels.
        if h.proc.poll() is None:
            os.kill(h.proc.pid, signal.SIGCONT)
        h.stop()


def process_state(pid: int) -> str:
    # /proc/<pid>/stat: "pid (comm) state ..."; comm may contain spaces, so split after the last ')'.
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()[0]


async def markers(store: LocalStore, owner: str) -> list[dict[str, Any]]:
    found = []
    async for info in store.list(f"markers/{owner}/"):
        found.append(json.loads((await store.read(info.key)).data))
    return found


async def test_killed_holder_is_taken_over_after_expiry(tmp_path: Path, holders: list[Holder]) -> None:
    root = tmp_path / "store"
    store = LocalStore(root)
    holder = Holder(root, tmp_path / "h1", owner="victim")
    holders.append(holder)
    epoch = holder.held()["epoch"]
    await wait_for(lambda: markers(store, "victim"), timeout=10, what="the holder's first marker")
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait(timeout=10)
    last = await read_lock(store, NAME)
    assert last is not None and last.owner == "victim" and not last.released

    successor = StorageLock(store, NAME, owner="successor", settings=SETTINGS)
    async with successor.hold(timeout=10) as lease:
        taken_at = time.time()
        assert taken_at > last.expires_at + SETTINGS.max_drift
        assert lease.epoch == epoch + 1
        assert lease.took_over_from == "victim"
    assert (await read_lock(store, NAME)) is not None


async def test_frozen_holder_finds_out_and_acts_no_more(tmp_path: Path, holders: list[Holder]) -> None:
    root = tmp_path / "store"
    store = LocalStore(root)
    holder = Holder(root, tmp_path / "h1", owner="sleeper")
    holders.append(holder)
    stale_epoch = holder.held()["epoch"]
    await wait_for(lambda: _at_least(store, "sleeper", 3), timeout=10, what="three markers")

    holder.proc.send_signal(signal.SIGSTOP)
    wait_for_sync(lambda: process_state(holder.proc.pid) == "T", timeout=10, what="the holder to stop")
    stopped_at = time.time()

    # Another contender takes the lock over once the frozen holder's lease expired.
    successor = StorageLock(store, NAME, owner="successor", settings=SETTINGS)
    lease = await successor.acquire(timeout=10)
    try:
        assert lease.epoch == stale_epoch + 1
        assert lease.took_over_from == "sleeper"
        before = {m["seq"] for m in await markers(store, "sleeper")}

        holder.proc.send_signal(signal.SIGCONT)
        exited = await wait_for(lambda: _exited(holder.proc), timeout=20, what="the resumed holder to stop")
        assert exited == (3,), (holder.out / "stderr.txt").read_text()
        result = json.loads((holder.out / "result.json").read_text())
        assert result["error"] in {"LockLost", "Fenced"}
        assert result["epoch"] == stale_epoch

        # It wrote nothing on a check made after it was frozen: at most the one write whose check
        # passed before the freeze was still in flight, and it lands under the old check time.
        after = await markers(store, "sleeper")
        assert all(m["epoch"] == stale_epoch and m["checked_at"] < stopped_at for m in after)
        assert len({m["seq"] for m in after} - before) <= 1
        # Its release on the way out did not touch the successor's lock.
        rec = await read_lock(store, NAME)
        assert rec is not None
        assert (rec.owner, rec.epoch, rec.released) == ("successor", stale_epoch + 1, False)
        lease.check()
    finally:
        await lease.release()


async def _at_least(store: LocalStore, owner: str, n: int) -> bool:
    return len(await markers(store, owner)) >= n


async def _exited(proc: subprocess.Popen[bytes]) -> tuple[int] | None:
    code = proc.poll()
    return None if code is None else (code,)
