"""The worker's heap trim: glibc's malloc_trim found and called on its timer, never when off."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from shared import ConfigError, load_settings
from tests._support.wait import wait_for
from workers._heap import load_malloc_trim, trim_heap_forever


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_malloc_trim_is_found_and_callable() -> None:
    fn = load_malloc_trim()
    assert fn is not None
    assert fn(0) in (0, 1)


async def test_it_calls_trim_on_its_timer_until_cancelled() -> None:
    calls: list[int] = []

    def trim(pad: int) -> int:
        calls.append(pad)
        return 1

    task = asyncio.create_task(trim_heap_forever(0.01, trim))

    async def three() -> bool:
        return len(calls) >= 3

    await wait_for(three, timeout=10, what="three trims")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert set(calls) == {0}


async def test_off_returns_at_once_without_calling() -> None:
    def trim(pad: int) -> int:
        raise AssertionError("called while off")

    await asyncio.wait_for(trim_heap_forever(0.0, trim), timeout=5)


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ConfigError, match="malloc_trim_interval"):
        load_settings(env={}, overrides={"worker": {"malloc_trim_interval": -1}})


def test_tune_gc_freezes_start_up_and_sets_the_worker_thresholds() -> None:
    # In a child: the setting is process-wide and must not leak into the test process.
    code = (
        "import gc\n"
        "from workers._heap import GC_THRESHOLDS, tune_gc\n"
        "assert gc.get_freeze_count() == 0 and gc.get_threshold() != GC_THRESHOLDS\n"
        "tune_gc()\n"
        "assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
