"""A shard runner that does not end after a stop: cancelled and reported, then fatal (workers._runners)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import load_settings
from shared.fleet import ProcessTasks
from tests._support.cancels import loses_cancels
from workers._runners import RunnerHung, ShardRunners, stop_overdue


@given(
    st.floats(0, 1e6),
    st.lists(st.floats(0, 1e4), min_size=2, max_size=10),
    st.floats(0, 1e3),
    st.floats(0.01, 1e3),
)
def test_stop_overdue_only_grows_with_time(
    asked: float, afters: list[float], grace: float, overdue: float
) -> None:
    levels = [stop_overdue(asked, asked + a, grace, overdue) for a in sorted(afters)]
    assert levels == sorted(levels)
    assert set(levels) <= {0, 1, 2}


def test_stop_overdue_thresholds() -> None:
    assert stop_overdue(100.0, 100.0, 30.0, 30.0) == 0
    assert stop_overdue(100.0, 159.9, 30.0, 30.0) == 0  # draining, then a first grace
    assert stop_overdue(100.0, 160.0, 30.0, 30.0) == 1  # cancel it
    assert stop_overdue(100.0, 189.9, 30.0, 30.0) == 1
    assert stop_overdue(100.0, 190.0, 30.0, 30.0) == 2  # end the process


class _FakeRunner:
    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.stopping = asyncio.Event()

    def request_stop(self) -> None:
        self.stopping.set()


def _runners(overdue_s: float) -> ShardRunners:
    settings = load_settings(env={}, overrides={"worker": {"drain_grace": 0.05}})
    return ShardRunners(settings, "w1", overdue_s=overdue_s)


@pytest.mark.parametrize("lost_cancels", [0, 3])
async def test_an_overdue_runner_is_reported_and_cancelled(
    lost_cancels: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="workers")
    runners = _runners(overdue_s=2.0)
    cancels: list[int] = []
    async with ProcessTasks("p", stop=asyncio.Event()) as process:
        task = process.start(loses_cancels(lost_cancels, cancels), "shard 3")
        runners.by_shard[3] = (cast(Any, _FakeRunner(3)), task)
        async with asyncio.timeout(30):
            await runners.wait_stopped(process)
        assert task.cancelled()
        assert process.crashed is None
    assert len(cancels) == lost_cancels + 1
    reports = [r for r in caplog.records if "did not end after it was asked to stop" in r.getMessage()]
    assert len(reports) == 1  # once, however many rounds it took


async def test_a_runner_that_cannot_be_cancelled_ends_the_process() -> None:
    runners = _runners(overdue_s=0.3)
    cancels: list[int] = []
    stop = asyncio.Event()
    free = asyncio.Event()
    async with ProcessTasks("p", stop=stop) as process:
        try:
            task = process.start(loses_cancels(10**9, cancels, free=free), "shard 5")
            runners.by_shard[5] = (cast(Any, _FakeRunner(5)), task)
            async with asyncio.timeout(30):
                await runners.wait_stopped(process)
            assert isinstance(process.crashed, RunnerHung), process.crashed
            assert stop.is_set()
            assert cancels  # it was cancelled before the process gave up
        finally:
            free.set()  # the test's own clean-up: ProcessTasks cancels it until it ends


async def test_a_runner_that_stops_in_time_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="workers")
    runners = _runners(overdue_s=5.0)
    runner = _FakeRunner(1)
    async with ProcessTasks("p", stop=asyncio.Event()) as process:
        task = process.start(runner.stopping.wait(), "shard 1")
        runners.by_shard[1] = (cast(Any, runner), task)
        await runners.wait_stopped(process)
        assert task.done() and not task.cancelled()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
