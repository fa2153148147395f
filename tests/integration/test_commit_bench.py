"""How long one commit of 500 small files takes on each backend, with and without producer MD5s
(``pytest -m bench tests/integration/test_commit_bench.py -s``). Prints the figures docs/commit.md
quotes; asserts only that the commit is exactly once."""

from __future__ import annotations

import hashlib
import random
import time

import pytest

from shared.commit import CommitRequest, StagedFile, WinningAttempt, commit_dataset
from shared.events import staged_key
from shared.storage import ObjectStore
from tests._support.commit import ManualLease, fast_settings, keys
from tests._support.emulators import StoreTarget

FILES = 500
LOSERS = 20


async def _stage(store: ObjectStore, dataset: str, *, with_md5: bool) -> CommitRequest:
    rng = random.Random(dataset)
    winners = []
    for task in range(FILES):
        body = rng.randbytes(rng.randint(1, 300))
        await store.write(staged_key("job-1", dataset, task, 0, "part.parquet"), body)
        md5 = hashlib.md5(body).hexdigest() if with_md5 else None
        winners.append(
            WinningAttempt(
                task=task, attempt=0, files=[StagedFile(path="part.parquet", size=len(body), md5=md5)]
            )
        )
    for n in range(LOSERS):
        await store.write(staged_key("job-1", dataset, n, 1, "part.parquet"), b"loser")
    return CommitRequest(dataset=dataset, job="job-1", winners=winners, expected_tasks=FILES)


@pytest.mark.bench
@pytest.mark.parametrize("with_md5", [False, True], ids=["size-only", "md5"])
async def test_commit_of_500_files(any_store: ObjectStore, store_target: StoreTarget, with_md5: bool) -> None:
    dataset = "md5" if with_md5 else "plain"
    req = await _stage(any_store, dataset, with_md5=with_md5)
    start = time.perf_counter()
    res = await commit_dataset(any_store, req, ManualLease(dataset, 1), fast_settings(concurrency=16))
    took = time.perf_counter() - start
    assert res.ok, res
    assert len(await keys(any_store, f"{dataset}/")) == FILES + 1  # the files and the manifest
    assert await keys(any_store, "_staging/") == []
    phases = ", ".join(f"{k} {v:.2f}s" for k, v in res.phase_seconds.items())
    print(
        f"\n[bench] {store_target.backend} {dataset}: {FILES} files in {took:.2f}s "
        f"({FILES / took:.0f} files/s; {phases})"
    )
