"""The benchmark's store wrappers: the latency model's shape, the counters' requests and rounds."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import pytest

from shared.settings import StoreSettings
from shared.storage import open_store
from shared.storage._counting import CountingStore
from shared.storage._latency import LatencyModel, LatencyStore


def test_latency_model_has_the_asked_median_and_tail() -> None:
    model = LatencyModel(0.020, 0.100, seed=7)
    samples = sorted(model.sample() for _ in range(20000))
    assert statistics.median(samples) == pytest.approx(0.020, rel=0.05)
    assert samples[int(0.99 * len(samples))] == pytest.approx(0.100, rel=0.15)
    assert min(samples) > 0


@pytest.mark.parametrize(("median", "p99"), [(-1.0, 1.0), (0.02, 0.01)])
def test_latency_model_refuses_nonsense(median: float, p99: float) -> None:
    with pytest.raises(ValueError, match="median"):
        LatencyModel(median, p99)


def test_settings_refuse_a_tail_below_the_median() -> None:
    with pytest.raises(ValueError, match="model_latency"):
        StoreSettings(model_latency_ms=20.0, model_latency_p99_ms=5.0)


async def test_open_store_wraps_with_modelled_latency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    waiting = peak = 0
    real_sleep = asyncio.sleep

    async def watched_sleep(delay: float) -> None:
        nonlocal waiting, peak
        waits.append(delay)
        waiting += 1
        peak = max(peak, waiting)
        try:
            await real_sleep(delay)
        finally:
            waiting -= 1

    monkeypatch.setattr(asyncio, "sleep", watched_sleep)  # the wrapper calls asyncio.sleep at each request
    store = open_store(tmp_path.as_uri(), StoreSettings(model_latency_ms=30.0, model_latency_p99_ms=30.0))
    assert isinstance(store, LatencyStore)
    async with store:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await store.write("a/b", b"x")
        await store.read("a/b")
        # Two requests in sequence wait two round trips of the configured 30 ms ...
        assert loop.time() - t0 >= 0.060
        assert waits == pytest.approx([0.030, 0.030]) and peak == 1
        await asyncio.gather(*(store.head("a/b") for _ in range(20)))
        # ... twenty in parallel wait at the same time (no timing: overlapping is what matters).
        assert len(waits) == 22 and peak == 20


async def test_counting_store_counts_requests_and_sequential_rounds(tmp_path: Path) -> None:
    async with CountingStore(open_store(tmp_path.as_uri())) as store:
        await store.write("d/x", b"1")
        await asyncio.gather(*(store.copy("d/x", f"d/y{i}") for i in range(5)))
        await asyncio.gather(*(store.delete(f"d/y{i}") for i in range(5)))
        keys = [i.key async for i in store.list("d/", page_size=1)]
        assert keys == ["d/x"]
        assert store.requests == {"write": 1, "copy": 5, "delete": 5, "list": 2}
        assert store.total == 13
        assert store.rounds == 4
        assert store.widths == [1, 5, 5, 1]  # the parallel copies and deletes: 5 in flight at once
        store.reset()
        assert store.total == 0
        assert store.rounds == 0
        assert store.widths == []


def test_model_p50_of_rounds_is_the_floor_a_latency_ratio_is_read_against() -> None:
    from coordinator.bench import model_p50
    from shared.storage._latency import LatencyModel

    constant = LatencyModel(0.02, 0.02, seed=1)
    assert model_p50(constant, [1, 4, 4, 1], draws=101) == pytest.approx(4 * 0.02)
    tail = LatencyModel(0.02, 0.1, seed=1)
    singles = model_p50(tail, [1] * 9, draws=4001)
    with_parallel = model_p50(tail, [1] * 7 + [4, 4], draws=4001)
    # A lognormal's mean is above its median, and a parallel round waits for its slowest request.
    assert 1.1 * 9 * 0.02 < singles < with_parallel
