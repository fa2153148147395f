"""A small measurement, printed and not asserted: the median latency of a conditional write."""

from __future__ import annotations

import statistics
import time

import pytest

from shared.storage import ObjectStore
from tests._support.emulators import StoreTarget

ROUNDS = 40


async def test_median_conditional_write_latency(
    any_store: ObjectStore, store_target: StoreTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    info = await any_store.write_if_absent("_locks/latency.json", b'{"epoch":0}')
    samples = []
    for epoch in range(1, ROUNDS + 1):
        payload = b'{"epoch":%d}' % epoch
        start = time.perf_counter()
        info = await any_store.write_if_match("_locks/latency.json", payload, info.version)
        samples.append(time.perf_counter() - start)
    assert (await any_store.read("_locks/latency.json")).data == b'{"epoch":%d}' % ROUNDS
    median_ms = statistics.median(samples) * 1000
    with capsys.disabled():
        print(
            f"\n[latency] {store_target.backend}: conditional write (write_if_match, 12 B) "
            f"median {median_ms:.1f} ms, p90 {statistics.quantiles(samples, n=10)[-1] * 1000:.1f} ms "
            f"over {ROUNDS}"
        )
