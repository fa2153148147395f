"""Prometheus text exposition of the fleet's metrics (no client library needed)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(slots=True)
class Histogram:
    """A cumulative histogram over :data:`BUCKETS` (seconds)."""

    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: int = 0
    sum: float = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        self.total += 1
        self.sum += value
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        """Return the sample lines of the histogram (``labels``: ``k="v",...`` to add)."""
        pre = f"{labels}," if labels else ""
        tail = f"{{{labels}}}" if labels else ""
        out = [
            f'{name}_bucket{{{pre}le="{bound}"}} {n}' for bound, n in zip(BUCKETS, self.counts, strict=True)
        ]
        out += [f'{name}_bucket{{{pre}le="+Inf"}} {self.total}', f"{name}_sum{tail} {self.sum}"]
        out.append(f"{name}_count{tail} {self.total}")
        return out


def render_metrics(
    status: Mapping[str, Any],
    *,
    events: Mapping[str, int],
    rejections: Mapping[str, int],
    commit_seconds: Histogram,
    recovery_seconds: Histogram,
    phase_seconds: Mapping[str, Histogram] | None = None,
) -> str:
    """Return the Prometheus text for a status document and the aggregated admin events.

    Fleet-wide counters come from the workers' metrics hash (``intake``,
    ``rejected``, ``committed``, ``aborted``, ``quarantined``,
    ``lock_takeovers``); gauges from the status document; histograms (commit,
    recovery, and each commit phase: the step latencies) and per-type event
    counts from the admin stream as seen since this coordinator started.
    """
    fleet = status["fleet"]
    lab = f'fleet="{fleet}"'
    out: list[str] = []
    counters = status.get("counters", {})
    for name in ("intake", "rejected", "committed", "aborted", "quarantined", "lock_takeovers"):
        metric = f"commitfleet_{name}_total"
        out += [f"# TYPE {metric} counter", f"{metric}{{{lab}}} {int(counters.get(name, 0))}"]
    rows = status["shard_table"]
    gauges = {
        "commitfleet_workers": len(status["workers"]),
        "commitfleet_open_jobs": len(status["open_jobs"]),
        "commitfleet_pending_datasets": len(status["pending"]),
        "commitfleet_quarantined_datasets": len(status["quarantined"]),
        "commitfleet_lag_entries": sum(r["lag"] for r in rows),
        "commitfleet_pending_entries": sum(r["pending"] for r in rows),
        "commitfleet_dead_letters": sum(r["dead_letters"] for r in rows),
        "commitfleet_assignment_epoch": status["assignment_epoch"],
    }
    for metric, value in gauges.items():
        out += [f"# TYPE {metric} gauge", f"{metric}{{{lab}}} {value}"]
    out.append("# TYPE commitfleet_shard_lag_entries gauge")
    out += [f'commitfleet_shard_lag_entries{{{lab},shard="{r["shard"]}"}} {r["lag"]}' for r in rows]
    out.append("# TYPE commitfleet_admin_events_total counter")
    out += [f'commitfleet_admin_events_total{{{lab},type="{t}"}} {n}' for t, n in sorted(events.items())]
    out.append("# TYPE commitfleet_rejections_total counter")
    out += [f'commitfleet_rejections_total{{{lab},reason="{t}"}} {n}' for t, n in sorted(rejections.items())]
    for name, hist in (
        ("commitfleet_commit_duration_seconds", commit_seconds),
        ("commitfleet_recovery_duration_seconds", recovery_seconds),
    ):
        out += [f"# TYPE {name} histogram", *hist.lines(name, lab)]
    out.append("# TYPE commitfleet_commit_phase_seconds histogram")
    for phase, hist in sorted((phase_seconds or {}).items()):
        out += hist.lines("commitfleet_commit_phase_seconds", f'{lab},phase="{phase}"')
    return "\n".join(out) + "\n"
