"""``commitfleet bench commit`` on a small workload: every mode commits everything, and is checked."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from coordinator.bench import Workload, open_raw, run_commit_bench, stage, verify
from shared import Settings, load_settings
from shared.storage import open_store


def _settings(root: Path, redis_url: str = "", latency_ms: float = 0.0) -> Settings:
    return load_settings(
        env={},
        overrides={
            "redis": {"url": redis_url or "redis://127.0.0.1:1/0"},
            "store": {
                "url": root.as_uri(),
                "model_latency_ms": latency_ms,
                "model_latency_p99_ms": latency_ms,
            },
            "lock": {"validity": 15.0, "renew_interval": 3.0, "poll_min": 0.02, "poll_max": 0.5},
            "worker": {"lease": 6.0, "heartbeat": 1.0, "read_block_ms": 100},
        },
    )


async def test_every_mode_commits_everything(tmp_path: Path, redis_url: str) -> None:
    root = tmp_path / "store"
    root.mkdir()
    s = _settings(root, redis_url, latency_ms=2.0)
    console = Console(file=open(tmp_path / "out.txt", "w"), width=200)  # noqa: SIM115
    results = await run_commit_bench(
        s,
        Workload(datasets=6, files=3, size=512),
        modes=["baseline", "core", "fleet"],
        workers=2,
        inflight=4,
        console=console,
    )
    console.file.close()
    assert [r.mode for r in results] == ["baseline", "core", "fleet"]
    assert all(r.seconds > 0 and r.datasets == 6 for r in results)
    # The single driver makes one copy and one delete per file and one manifest write.
    assert results[0].requests_per_dataset == pytest.approx(3 * 2 + 1)
    text = (tmp_path / "out.txt").read_text()
    assert "x baseline" in text
    assert "one 4-file commit" in text


async def test_verify_catches_a_missing_publish(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    w = Workload(datasets=2, files=2, size=16)
    async with open_raw(s) as raw:
        await stage(raw, w, "baseline")
        with pytest.raises(AssertionError, match="published files"):
            await verify(raw, w, "baseline")


def test_raw_store_drops_the_model(tmp_path: Path) -> None:
    s = _settings(tmp_path, latency_ms=5.0)
    assert type(open_raw(s)).__name__ == "LocalStore"
    assert type(open_store(s.store.url, s.store)).__name__ == "LatencyStore"
    assert msgspec.structs.asdict(s.store)["model_latency_ms"] == 5.0


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this machine")
async def test_with_a_latency_model_the_default_store_is_in_memory_and_removed(tmp_path: Path) -> None:
    s = _settings(tmp_path, latency_ms=1.0)
    s = msgspec.structs.replace(s, store=msgspec.structs.replace(s.store, url=""))
    before = set(Path("/dev/shm").glob("commitfleet-bench-commit-*"))
    console = Console(file=open(tmp_path / "out.txt", "w"), width=300)  # noqa: SIM115
    results = await run_commit_bench(
        s, Workload(datasets=2, files=2, size=64), modes=["baseline"], workers=1, inflight=2, console=console
    )
    console.file.close()
    assert [r.datasets for r in results] == [2]
    assert "on file:///dev/shm/commitfleet-bench-commit-" in (tmp_path / "out.txt").read_text()
    assert set(Path("/dev/shm").glob("commitfleet-bench-commit-*")) == before  # removed after the run
