"""The life of a fleet process, in one event loop: start-up waits, fatal errors, per-shard backoff."""

from __future__ import annotations

import asyncio
import logging
import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import BadInput, ConfigError, Fenced, TransientError
from shared.fleet import (
    ProcessTasks,
    ReportingTaskGroup,
    startup_delay,
    unexpected,
    wait_until_up,
)
from shared.fleet._process import STARTUP_MAX_S
from workers._runners import RESTART_INITIAL_S, RESTART_MAX_S, restart_delay


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=2**32))
def test_startup_delay_is_capped_jittered_and_grows(attempt: int, seed: int) -> None:
    rng = random.Random(seed)
    cap = min(STARTUP_MAX_S, 0.5 * 2.0 ** min(attempt, 30))
    d = startup_delay(attempt, rng)
    assert cap / 2 <= d <= cap
    assert d <= STARTUP_MAX_S


@given(st.integers(min_value=1, max_value=10_000), st.integers(min_value=0, max_value=2**32))
def test_restart_delay_is_capped_jittered_and_grows(failures: int, seed: int) -> None:
    d = restart_delay(failures, random.Random(seed))
    cap = min(RESTART_MAX_S, RESTART_INITIAL_S * 2.0 ** min(failures - 1, 30))
    assert cap / 2 <= d <= cap <= RESTART_MAX_S


def test_unexpected_judges_each_member_of_a_group() -> None:
    bug = RuntimeError("bug")
    assert unexpected(bug, (BadInput,)) is bug
    assert unexpected(BadInput("x"), (BadInput,)) is None
    assert unexpected(asyncio.CancelledError(), ()) is None
    only_expected = ExceptionGroup("g", [BadInput("a"), ExceptionGroup("h", [Fenced("b")])])
    assert unexpected(only_expected, (BadInput, Fenced)) is None
    mixed = ExceptionGroup("g", [BadInput("a"), ExceptionGroup("h", [bug])])
    rest = unexpected(mixed, (BadInput,))
    assert rest is not None
    assert [type(e) for e in rest.exceptions] == [ExceptionGroup]
    assert rest.exceptions[0].exceptions == (bug,)  # type: ignore[attr-defined]


async def test_wait_until_up_waits_out_transient_errors_and_logs_each_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    async def step() -> str:
        nonlocal calls
        calls += 1
        if calls <= 3:
            raise TransientError(f"redis down ({calls})")
        return "up"

    caplog.set_level(logging.WARNING, logger="commitfleet.process")
    got = await wait_until_up(step, stop=asyncio.Event(), what="reach redis", initial=0.01)
    assert got == "up" and calls == 4
    waits = [r for r in caplog.records if "cannot reach redis yet" in r.getMessage()]
    assert len(waits) == 3
    assert [r.fields["attempt"] for r in waits] == [1, 2, 3]  # type: ignore[attr-defined]
    assert "redis down (3)" in waits[-1].fields["error"]  # type: ignore[attr-defined]


async def test_wait_until_up_lets_a_config_error_through_at_once() -> None:
    async def step() -> None:
        raise ConfigError("bad password")

    with pytest.raises(ConfigError, match="bad password"):
        await wait_until_up(step, stop=asyncio.Event(), what="x")


async def test_stop_ends_the_wait_and_a_hanging_step_at_once() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def hangs() -> None:
        try:
            await asyncio.sleep(3600)  # a connect to an address that never answers
        finally:
            cancelled.set()

    async def fails() -> None:
        raise TransientError("down")

    for step in (hangs, fails):
        stop.clear()
        task = asyncio.create_task(wait_until_up(step, stop=stop, what="x", initial=100.0))
        await asyncio.sleep(0.05)
        assert not task.done()
        started = time.monotonic()
        stop.set()
        assert await asyncio.wait_for(task, 2) is None
        assert time.monotonic() - started < 1.0
    assert cancelled.is_set()


async def test_a_child_error_is_fatal_at_once_logged_and_stops_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = asyncio.Event()
    fatal_calls: list[str] = []
    other_cancelled = asyncio.Event()

    async def bug() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("missing")

    async def other() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            other_cancelled.set()
            raise

    caplog.set_level(logging.ERROR, logger="commitfleet.process")
    async with ProcessTasks("p", stop=stop, on_fatal=lambda: fatal_calls.append("x")) as process:
        process.start(other(), "other")
        process.start(bug(), "the buggy part")
        await asyncio.wait_for(stop.wait(), 5)
        assert isinstance(process.crashed, KeyError)
        assert process.crashed_in == "the buggy part"
        assert fatal_calls == ["x"]
        await asyncio.wait_for(other_cancelled.wait(), 5)
    (rec,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert "fatal error in the buggy part" in rec.getMessage()
    assert rec.exc_info is not None and rec.exc_info[1] is process.crashed


async def test_leaving_the_block_cancels_children_until_they_end() -> None:
    stubborn_ended = asyncio.Event()

    async def stubborn() -> None:
        # Swallows the first two cancellations (as a lost one would look).
        for _ in range(2):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue
        stubborn_ended.set()

    async with ProcessTasks("p", stop=asyncio.Event()) as process:
        process.start(stubborn(), "stubborn")
        await asyncio.sleep(0.01)
    assert stubborn_ended.is_set()
    assert process.crashed is None


async def test_reporting_task_group_reports_bugs_at_once_not_expected_errors() -> None:
    stop = asyncio.Event()
    release = asyncio.Event()

    async def slow_to_die() -> None:
        # A sibling that ignores its cancellation until released: the bug must be reported meanwhile.
        while True:
            try:
                await release.wait()
                return
            except asyncio.CancelledError:
                continue

    async def runner(error: BaseException) -> None:
        async def fail() -> None:
            raise error

        async with ReportingTaskGroup("shard 7") as tg:
            tg.create_task(slow_to_die())
            tg.create_task(fail())

    async with ProcessTasks("p", stop=stop) as process:
        try:
            t = asyncio.create_task(runner(BadInput("per-shard trouble")))
            await asyncio.sleep(0.05)
            assert process.crashed is None  # an expected error is the runner's business
            release.set()
            with pytest.raises(ExceptionGroup):
                await t
            release.clear()
            t = asyncio.create_task(runner(ZeroDivisionError("bug")))
            await asyncio.wait_for(stop.wait(), 5)  # reported while the group still waits for a child
            assert isinstance(process.crashed, ZeroDivisionError)
            assert process.crashed_in == "shard 7"
            assert not t.done()
            release.set()
            with pytest.raises(ExceptionGroup):
                await t
        finally:
            release.set()
