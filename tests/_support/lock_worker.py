"""A lock contender in its own process, for the multi-process lock tests.

Run as ``python -m tests._support.lock_worker '<json>'`` from the repository root. The JSON says
which ``mode`` to run and where (``root``: a local store directory shared by every process):

``hold``
    Take the lock once (``owner``), write ``<out>/held.json`` (epoch, owner), then loop: ``lease.check()``,
    then write a marker object ``markers/<owner>/<seq>.json`` holding the epoch and the wall time at which
    the check passed. When the lease is lost, write ``<out>/result.json`` (the error's class and message)
    and exit with status 3. Used to kill (SIGKILL) or freeze (SIGSTOP) a holder.

``stress``
    Run ``contenders`` asyncio tasks, each taking the lock once, holding it a random 0-50 ms and
    releasing it. It first writes ``<out>/ready-<proc>`` and waits for ``<out>/go`` so that every
    process starts together. Inside the critical section each task creates ``<out>/inside`` with
    O_EXCL (a second holder would find it there) and, still holding, appends one JSON line to
    ``<out>/holds-<proc>.jsonl``: owner, epoch, when it asked (``req``), when it got the lock (``t0``),
    when it let go (``t1``), and whether it saw an overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from shared import LockLost
from shared.locks import StorageLock
from shared.settings import LockSettings
from shared.storage._local import LocalStore


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


async def hold(cfg: dict[str, Any]) -> int:
    out = Path(cfg["out"])
    settings = LockSettings(**cfg["settings"])
    store = LocalStore(Path(cfg["root"]))
    lock = StorageLock(store, cfg["name"], owner=cfg["owner"], settings=settings)
    seq = 0
    epoch = 0
    try:
        async with lock.hold(timeout=30) as lease:
            epoch = lease.epoch
            _write_atomic(out / "held.json", {"epoch": epoch, "owner": lock.owner})
            while True:
                lease.check()
                checked_at = time.time()
                body = json.dumps({"epoch": epoch, "seq": seq, "checked_at": checked_at}).encode()
                await store.write(f"markers/{lock.owner}/{seq:06d}.json", body)
                seq += 1
                await asyncio.sleep(0.02)
    except LockLost as exc:
        _write_atomic(
            out / "result.json",
            {"error": type(exc).__name__, "message": str(exc), "epoch": epoch, "at": time.time()},
        )
        return 3


async def stress(cfg: dict[str, Any]) -> int:
    out = Path(cfg["out"])
    proc = cfg["proc"]
    settings = LockSettings(**cfg["settings"])
    store = LocalStore(Path(cfg["root"]), durable=cfg.get("durable", True))
    inside = out / "inside"
    rng = random.Random()
    log = open(out / f"holds-{proc}.jsonl", "a", buffering=1)  # noqa: SIM115 - closed below

    async def contender(i: int) -> None:
        lock = StorageLock(store, cfg["name"], owner=f"p{proc}-t{i}", settings=settings)
        req = time.time()
        async with lock.hold(timeout=cfg.get("timeout", 600)) as lease:
            t0 = time.time()
            overlap = False
            try:
                fd = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                overlap = True
            else:
                os.close(fd)
            await asyncio.sleep(rng.uniform(0, 0.05))
            lease.check()
            if not overlap:
                os.unlink(inside)
            t1 = time.time()
            line = {"owner": lock.owner, "epoch": lease.epoch, "req": req, "t0": t0, "t1": t1}
            log.write(json.dumps({**line, "overlap": overlap}) + "\n")

    (out / f"ready-{proc}").touch()
    while not (out / "go").exists():
        await asyncio.sleep(0.005)
    try:
        async with asyncio.TaskGroup() as tg:
            for i in range(cfg["contenders"]):
                tg.create_task(contender(i))
    finally:
        log.close()
    return 0


def main() -> int:
    cfg = json.loads(sys.argv[1])
    mode = {"hold": hold, "stress": stress}[cfg["mode"]]
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(mode(cfg))
    return 130


if __name__ == "__main__":
    sys.exit(main())
