"""``commitfleet bench cluster`` runs end to end (tiny workload): ``pytest -m redis_cluster``."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from coordinator.bench import Workload, run_cluster_bench
from shared import load_settings

pytestmark = pytest.mark.redis_cluster


async def test_cluster_bench_commits_the_workload_on_both_backends(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    settings = load_settings(env={}, overrides={"store": {"url": (tmp_path / "store").as_uri()}})
    buf = io.StringIO()
    rows = await run_cluster_bench(
        settings, Workload(datasets=12, files=2, size=256), worker_counts=[1, 2], console=Console(file=buf)
    )
    assert [(r.backend, r.workers) for r in rows] == [
        ("one node", 1),
        ("cluster, 3 masters", 1),
        ("one node", 2),
        ("cluster, 3 masters", 2),
    ]
    assert all(len(r.results) == 1 and r.results[0].datasets == 12 and r.rate > 0 for r in rows)
    assert "datasets/s" in buf.getvalue()
