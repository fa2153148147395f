"""The Hudi RFC-91 review's stress test: many contenders across processes, never two holders.

Contenders are asyncio tasks spread over several ``lock_worker stress`` processes on one local store.
The observer does not trust the lock: every holder logs its hold (owner, epoch, wall-clock start and
end, written while still holding) and creates an O_EXCL marker file inside its critical section, which a
second concurrent holder would find already there. The observer then checks that no two holds overlap
in time, no marker collision happened, and the epochs in hold order are exactly 1, 2, ..., N.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests._support.wait import wait_for_sync

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Figures:
    holds: int
    total_s: float
    per_second: float
    max_wait_s: float
    mean_wait_s: float


def run_stress(tmp_path: Path, *, processes: int, per_process: int, settings: dict[str, float]) -> Figures:
    root, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for p in range(processes):
            cfg = {
                "mode": "stress",
                "root": str(root),
                "name": "hot",
                "out": str(out),
                "proc": p,
                "contenders": per_process,
                "settings": settings,
                "timeout": 600,
            }
            with open(out / f"stderr-{p}.txt", "wb") as err:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tests._support.lock_worker", json.dumps(cfg)],
                        cwd=REPO,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
                )

        def all_ready() -> bool:
            for p, proc in enumerate(procs):
                if proc.poll() is not None:
                    raise AssertionError((out / f"stderr-{p}.txt").read_text())
            return all((out / f"ready-{p}").exists() for p in range(processes))

        wait_for_sync(all_ready, timeout=60, what="every stress process to be ready")
        (out / "go").touch()
        for p, proc in enumerate(procs):
            assert proc.wait(timeout=900) == 0, (out / f"stderr-{p}.txt").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    holds: list[dict[str, Any]] = []
    for p in range(processes):
        holds += [json.loads(line) for line in (out / f"holds-{p}.jsonl").read_text().splitlines()]
    return observe(holds, expected=processes * per_process)


def observe(holds: list[dict[str, Any]], *, expected: int) -> Figures:
    """Check the holds without trusting the lock; return the measured figures."""
    assert len(holds) == expected, f"{len(holds)} holds logged, {expected} expected"
    assert not [h for h in holds if h["overlap"]], "a holder found another holder's marker"
    assert len({h["owner"] for h in holds}) == expected
    holds.sort(key=lambda h: h["t0"])
    for before, after in itertools.pairwise(holds):
        assert before["t1"] <= after["t0"], f"overlapping holds: {before} and {after}"
    epochs = [h["epoch"] for h in holds]
    assert epochs == list(range(1, expected + 1)), "epochs do not go up by exactly one per hold"
    waits = [h["t0"] - h["req"] for h in holds]
    total = max(h["t1"] for h in holds) - min(h["req"] for h in holds)
    return Figures(
        holds=expected,
        total_s=round(total, 2),
        per_second=round(expected / total, 1),
        max_wait_s=round(max(waits), 2),
        mean_wait_s=round(sum(waits) / len(waits), 2),
    )


def test_observer_catches_overlaps() -> None:
    # The observer itself must be able to fail: feed it two overlapping holds.
    holds = [
        {"owner": "a", "epoch": 1, "req": 0.0, "t0": 1.0, "t1": 2.0, "overlap": False},
        {"owner": "b", "epoch": 2, "req": 0.0, "t0": 1.5, "t1": 2.5, "overlap": False},
    ]
    with pytest.raises(AssertionError, match="overlapping"):
        observe(holds, expected=2)
    holds[1].update(t0=2.0, t1=3.0, epoch=3)
    with pytest.raises(AssertionError, match="epochs"):
        observe(holds, expected=2)


def test_hundred_contenders_over_four_processes_never_overlap(tmp_path: Path) -> None:
    settings = {
        "validity": 5.0,
        "renew_interval": 1.5,
        "max_drift": 0.1,
        "acquire_timeout": 120.0,
        "poll_min": 0.01,
        "poll_max": 0.2,
    }
    started = time.monotonic()
    figures = run_stress(tmp_path, processes=4, per_process=25, settings=settings)
    print(f"\nstress-100: {figures}, wall {time.monotonic() - started:.1f}s")


@pytest.mark.stress
@pytest.mark.timeout(1200)
def test_thousand_contenders_over_four_processes_never_overlap(tmp_path: Path) -> None:
    settings = {
        "validity": 10.0,
        "renew_interval": 3.0,
        "max_drift": 0.1,
        "acquire_timeout": 900.0,
        # The default poll bounds: with ~1000 waiters someone looks within milliseconds of a release
        # anyway, and shorter polls only add read load that slows the hand-over.
        "poll_min": 0.05,
        "poll_max": 2.0,
    }
    started = time.monotonic()
    figures = run_stress(tmp_path, processes=4, per_process=250, settings=settings)
    print(f"\nstress-1000: {figures}, wall {time.monotonic() - started:.1f}s")
