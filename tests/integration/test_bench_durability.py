"""`commitfleet bench intake|commit --durability` runs end to end (tiny workloads, a master and a replica)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from coordinator.bench import Workload, parse_levels, run_durability_bench
from shared import ConfigError, load_settings
from tests._support.redis_server import modern_redis_server


def test_levels_are_parsed_memory_first() -> None:
    assert parse_levels("aof+replicas,replicas") == ["memory", "aof+replicas", "replicas"]
    assert parse_levels("all") == ["memory", "replicas", "aof", "aof+replicas"]
    with pytest.raises(ConfigError, match="got 'disk'"):
        parse_levels("replicas,disk")


async def test_intake_at_each_aof_level_against_memory(tmp_path: Path) -> None:
    settings = load_settings(env={}, overrides={"store": {"url": (tmp_path / "store").as_uri()}})
    buf = io.StringIO()
    rows = await run_durability_bench(
        settings,
        "intake",
        ["memory", "aof"],
        console=Console(file=buf, width=200),
        rounds=1,
        events=1000,
        redis_server=modern_redis_server(),
        appendfsync="always",
    )
    assert [r.level for r in rows] == ["memory", "aof"]
    assert all(len(r.rates) == 1 and r.rate > 0 for r in rows)
    assert "appendonly yes, appendfsync always" in buf.getvalue()
    assert "x memory" in buf.getvalue()


async def test_commits_with_replicas_against_memory(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    settings = load_settings(env={}, overrides={"store": {"url": (tmp_path / "store").as_uri()}})
    buf = io.StringIO()
    rows = await run_durability_bench(
        settings,
        "commit",
        ["memory", "replicas"],
        console=Console(file=buf, width=200),
        rounds=1,
        workload=Workload(datasets=6, files=1, size=256),
        workers=1,
    )
    assert [r.level for r in rows] == ["memory", "replicas"]
    assert all(r.rate > 0 and len(r.latencies) == 1 for r in rows)
    assert "appendonly no" in buf.getvalue()
