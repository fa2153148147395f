"""``commitfleet bench`` (intake): alternating rounds, and no start-up race with the worker."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from rich.console import Console

from coordinator.bench import run_bench
from shared import load_settings
from shared.queue import ShardConsumer


async def test_the_observer_never_polls_a_group_the_worker_has_not_created_yet(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker slow to create its consumer group (as under load): the shard already counts as
    # running, the group is not there yet. The benchmark must not die on `no consumer group`.
    real = ShardConsumer.ensure_group

    async def slow(self: ShardConsumer) -> None:
        if self.consumer != "bench-observer":
            await asyncio.sleep(0.5)
        await real(self)

    monkeypatch.setattr(ShardConsumer, "ensure_group", slow)
    monkeypatch.setenv("REDIS_URL", redis_url)
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        ratio = await run_bench(load_settings(env={}), 300, console=Console(file=fh, width=200), rounds=2)
    text = out.read_text()
    assert ratio > 0
    rounds = re.findall(
        r"round (\d): raw XREADGROUP\+XACK [\d,]+ events/s, worker intake .* ratio ([\d.]+)", text
    )
    assert [r for r, _ in rounds] == ["1", "2"]
    assert f"ratio intake/raw: {ratio:.2f} (median of 2)" in text
