"""CPU of the commit core and the local store per committed dataset, in one process (a script, not a test).

Stages ``--datasets`` datasets of ``--files`` files (not measured), then commits
them through the commit core, ``--par`` at a time, each under its storage lock,
on a durable local store, and prints the process's user and system CPU (every
thread) per dataset::

    .venv/bin/python -m tests.bench.local_store_cpu --datasets 200
    .venv/bin/python -m tests.bench.local_store_cpu --datasets 200 --dir /dev/shm

With ``--dir`` on a tmpfs, the figure is the store's own work and the commit
core's, without the file system's: on a shared ext4 without a journal, the
kernel's inode allocation (it skips every inode freed in the last minutes)
costs more than everything else and varies with what other processes delete.
Compare two trees by running this alternately in both (same machine, same run).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from shared.commit import CommitRequest, StagedFile, WinningAttempt, commit_dataset
from shared.events import lock_name, staged_key
from shared.locks import StorageLock
from shared.settings import LockSettings
from shared.storage._local import LocalStore
from tests._support.commit import fast_settings


async def _stage(store: LocalStore, dataset: str, files: int) -> CommitRequest:
    winners = []
    for task in range(files):
        body = os.urandom(2048)
        path = f"part-{task}.parquet"
        await store.write(staged_key("job-1", dataset, task, 0, path), body)
        md5 = hashlib.md5(body).hexdigest()
        winners.append(
            WinningAttempt(
                task=task,
                attempt=0,
                files=[StagedFile(path=path, size=len(body), md5=md5)],
                watermarks={"p": task},
            )
        )
    return CommitRequest(dataset=dataset, job="job-1", winners=winners, expected_tasks=files)


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


async def run(args: argparse.Namespace) -> float:
    """Return the CPU milliseconds per committed dataset (and print the breakdown)."""
    root = Path(tempfile.mkdtemp(prefix="cf-store-cpu-", dir=args.dir))
    try:
        async with LocalStore(root, durable=False) as staging:
            reqs = [await _stage(staging, f"ds{i}", args.files) for i in range(args.datasets)]
        settings = fast_settings(concurrency=16)
        gate = asyncio.Semaphore(args.par)
        async with LocalStore(root, durable=True) as store:

            async def one(req: CommitRequest) -> None:
                async with gate:
                    lock = StorageLock(store, lock_name(req.dataset), owner="bench", settings=LockSettings())
                    async with lock.hold() as lease:
                        res = await commit_dataset(store, req, lease, settings)
                    assert res.ok, res

            (u0, s0), t0 = _cpu(), time.monotonic()
            await asyncio.gather(*(one(r) for r in reqs))
            (u1, s1), t1 = _cpu(), time.monotonic()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    n = args.datasets

    def per(seconds: float) -> float:
        return seconds / n * 1000

    print(
        f"{n} datasets x {args.files} files: CPU {per(u1 - u0 + s1 - s0):.2f} ms per dataset "
        f"(user {per(u1 - u0):.2f}, system {per(s1 - s0):.2f}); wall {per(t1 - t0):.2f} ms per dataset"
    )
    return per(u1 - u0 + s1 - s0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", type=int, default=200)
    p.add_argument("--files", type=int, default=10)
    p.add_argument("--par", type=int, default=8, help="datasets committed at once")
    p.add_argument("--dir", default=None, help="where the temporary store goes (a tmpfs: /dev/shm)")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
