"""Head starts: a step's preparation runs beside the steps before it, and its step takes it once, in turn.

Through the executor (``run_steps``) on a real local store, with custom steps that record what they saw.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest

from shared import LockLost, TransientError
from shared._retry import RetryPolicy
from shared.commit import CommitStep, HeadStarts, StepContext
from shared.commit._execute import run_steps
from shared.commit._head_start import worth_starting
from shared.settings import Settings, StoreSettings
from shared.storage import open_store
from tests._support.commit import ManualLease

EVENTS: list[str] = []
GATES: dict[str, asyncio.Event] = {}


class Prepared(CommitStep, frozen=True, kw_only=True, tag="test-prepared"):
    """An apply step whose preparation records itself and may fail, block or be slow."""

    prepares: ClassVar[bool] = True
    name: str
    fail: bool = False
    block: bool = False

    async def prepare(self, ctx: StepContext) -> object | None:
        EVENTS.append(f"prepare {self.name}")
        if self.block:
            await GATES[self.name].wait()
        if self.fail:
            raise TransientError("preparation failed (test)")
        return f"ready {self.name}"

    async def is_done(self, ctx: StepContext) -> bool:
        return False

    async def ensure(self, ctx: StepContext) -> bool:
        EVENTS.append(f"ensure {self.name} took {await ctx.head_starts.take(self)}")
        EVENTS.append(f"again {self.name} took {await ctx.head_starts.take(self)}")
        return True


class Slow(CommitStep, frozen=True, kw_only=True, tag="test-slow"):
    """An apply step before the prepared ones: it lets them run meanwhile."""

    async def is_done(self, ctx: StepContext) -> bool:
        return False

    async def ensure(self, ctx: StepContext) -> bool:
        EVENTS.append("slow starts")
        for name, gate in GATES.items():
            # The blocked preparation must have begun while this step runs (it is not run after it).
            deadline = asyncio.get_running_loop().time() + 5
            while f"prepare {name}" not in EVENTS:
                assert asyncio.get_running_loop().time() < deadline, "the preparation never began"
                await asyncio.sleep(0.001)
            gate.set()
            EVENTS.append(f"released {name}")
        return True


async def _run(tmp_path: Path, steps: list[CommitStep], latency_ms: float = 1.0) -> list[str]:
    EVENTS.clear()
    store_settings = StoreSettings(model_latency_ms=latency_ms, model_latency_p99_ms=max(latency_ms, 1.0))
    settings = msgspec.structs.replace(Settings(), store=store_settings)
    async with open_store((tmp_path / "store").as_uri(), store_settings) as store:
        ctx = StepContext(store=store, lease=ManualLease("ds", 1), settings=settings)

        async def fence(done: list[int]) -> None:
            EVENTS.append("fence")

        progress = await run_steps(
            steps, ctx, RetryPolicy(attempts=1).no_wait(), dataset="ds", job="j", listed={}, fence=fence
        )
    assert progress.failure is None, progress.failure
    return list(EVENTS)


async def test_each_step_takes_its_own_preparation_once_and_a_failed_one_is_none(tmp_path: Path) -> None:
    GATES.clear()
    events = await _run(tmp_path, [Slow(), Prepared(name="a"), Prepared(name="b", fail=True)])
    assert "ensure a took ready a" in events and "again a took None" in events
    assert "ensure b took None" in events  # its preparation failed: the step does all of its work in turn
    assert events.index("prepare a") < events.index("ensure a took ready a")


async def test_preparations_run_beside_the_steps_before_them(tmp_path: Path) -> None:
    GATES.clear()
    GATES["a"] = asyncio.Event()
    events = await _run(tmp_path, [Slow(), Prepared(name="a", block=True)])
    # The preparation began while the slow step ran, which released it; the step then took its result.
    assert events.index("prepare a") < events.index("released a") < events.index("ensure a took ready a")


async def test_no_head_start_on_plain_local_files(tmp_path: Path) -> None:
    GATES.clear()
    events = await _run(tmp_path, [Slow(), Prepared(name="a")], latency_ms=0.0)
    assert "prepare a" not in events and "ensure a took None" in events
    assert worth_starting("s3://bucket/root", 0.0) and worth_starting("file:///x", 5.0)
    assert not worth_starting("file:///x", 0.0)


async def test_a_preparation_not_taken_is_cancelled_with_the_run() -> None:
    GATES.clear()
    GATES["a"] = asyncio.Event()
    starts = HeadStarts()
    cancelled = asyncio.Event()

    class Parked(Prepared, frozen=True, kw_only=True, tag="test-parked"):
        async def prepare(self, ctx: StepContext) -> object | None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return None

    starts.start([Parked(name="a")], ctx=None)
    await asyncio.sleep(0)
    assert await starts.close() is None
    assert cancelled.is_set()
    assert await starts.close() is None  # twice: nothing left


async def test_a_run_that_fails_ends_its_preparations_and_raises_its_own_error(tmp_path: Path) -> None:
    GATES.clear()
    GATES["a"] = asyncio.Event()  # never released: the preparation is still running when the run fails
    with pytest.raises(LockLost):
        await _run(tmp_path, [Lost(), Prepared(name="a", block=True)])
    assert "prepare a" in EVENTS and not any(e.startswith("ensure a") for e in EVENTS)
    assert all(t.done() for t in asyncio.all_tasks() if t is not asyncio.current_task())


class Lost(CommitStep, frozen=True, kw_only=True, tag="test-lost"):
    """An apply step that finds its lease lost once the preparations began."""

    async def is_done(self, ctx: StepContext) -> bool:
        return False

    async def ensure(self, ctx: StepContext) -> bool:
        deadline = asyncio.get_running_loop().time() + 5
        while "prepare a" not in EVENTS:
            assert asyncio.get_running_loop().time() < deadline, "the preparation never began"
            await asyncio.sleep(0.001)
        raise LockLost("lease lost (test)")
