"""A worker that has left stays gone: its heartbeat never registers it again (one worker_left, not two)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import redis.asyncio

from shared import load_settings
from shared.events import AdminEvent, WorkerLeft
from shared.fleet import FleetRegistry, worker_info
from shared.queue import Keys
from tests._support.wait import wait_for
from workers import Worker


async def test_a_heartbeat_still_running_after_leave_does_not_bring_the_worker_back(
    redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = load_settings(
        overrides={
            "fleet": {"name": fleet_name},
            "store": {"url": (tmp_path / "store").as_uri()},
            "worker": {"heartbeat": 0.05, "lease": 5.0},
        },
        env={},
    )
    worker = Worker(settings, worker_id="w1")
    registry = FleetRegistry(redis_client, Keys(fleet_name))
    renewals = 0
    renew = registry.renew

    async def counted_renew(*args: Any, **kwargs: Any) -> bool:
        nonlocal renewals
        renewals += 1
        return await renew(*args, **kwargs)

    registry.renew = counted_renew  # type: ignore[method-assign]
    emitted: list[AdminEvent] = []

    async def emit(ev: AdminEvent) -> None:
        emitted.append(ev)

    await registry.register(worker_info("w1", time.time()), settings.worker.lease)
    # The heartbeat as a crashed worker can leave it running: its cancellation lost.
    beat = asyncio.create_task(worker._heartbeat(registry, time.time()))
    try:
        await wait_for(lambda: _at_least(lambda: renewals, 2), timeout=10, what="two heartbeats")
        await worker._leave(SimpleNamespace(registry=registry, emit=emit), reason="crashed")  # type: ignore[arg-type]
        assert [type(e) for e in emitted] == [WorkerLeft]
        live, dead = await registry.members()
        assert "w1" not in live and "w1" not in dead

        async def settled() -> bool:
            # Either the heartbeat ended, or it put the departed worker back (the bug).
            live, _dead = await registry.members()
            return beat.done() or "w1" in live

        await wait_for(settled, timeout=10, what="the heartbeat ended or re-registered")
        live, dead = await registry.members()
        assert "w1" not in live and "w1" not in dead, "a departed worker was registered again"
        assert beat.done() and beat.exception() is None
    finally:
        beat.cancel()
        await asyncio.gather(beat, return_exceptions=True)


async def _at_least(value: Any, n: int) -> bool:
    return bool(value() >= n)
