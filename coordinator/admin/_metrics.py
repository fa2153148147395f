"""The fleet's Prometheus metrics, exposed through prometheus_client.

Every label has a closed set of values, so a hostile or buggy message can
never add a series: ``fleet`` (this fleet's name), ``shard`` (0..shards-1),
``type`` (the admin event tags), ``reason`` (the reject reason codes of
:data:`shared.events.REJECT_REASONS`, anything else counts as ``other``) and
``phase`` (the commit phases, anything else counts as ``other``). Free text
(details, quarantine and abort reasons) never becomes a label value.

The names are listed in the README ("Metrics").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.events import (
    ADMIN_EVENT_TYPES,
    REJECT_REASONS,
    AdminEvent,
    Committed,
    MessageRejected,
    RecoveryDone,
)

BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

OTHER: Final = "other"
"""The label value of anything outside a label's closed set."""

PHASES: Final = ("publish", "apply", "manifest", "cleanup")
"""The phases a ``committed`` event reports (shared/commit: the step latencies)."""

EVENT_TYPES: Final[tuple[str, ...]] = tuple(sorted(ADMIN_EVENT_TYPES))

# The fleet-wide counters the workers keep in Redis (the status document's ``counters``).
COUNTERS: Final = ("intake", "rejected", "committed", "aborted", "quarantined", "lock_takeovers")


def bounded(value: str, allowed: frozenset[str] | tuple[str, ...]) -> str:
    """Return ``value`` when it is in ``allowed``, else :data:`OTHER`."""
    return value if value in allowed else OTHER


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

    def buckets(self) -> list[tuple[str, float]]:
        """Return the cumulative ``(le, count)`` pairs, ``+Inf`` last."""
        out = [(repr(b), float(n)) for b, n in zip(BUCKETS, self.counts, strict=True)]
        return [*out, ("+Inf", float(self.total))]


@dataclass
class EventAggregates:
    """What this coordinator saw on the admin stream since it started."""

    events: Counter[str] = field(default_factory=Counter)
    rejections: Counter[str] = field(default_factory=Counter)
    commit_seconds: Histogram = field(default_factory=Histogram)
    recovery_seconds: Histogram = field(default_factory=Histogram)
    phase_seconds: dict[str, Histogram] = field(default_factory=dict)

    def count(self, ev: AdminEvent) -> None:
        """Fold one admin event into the aggregates (label values bounded)."""
        self.events[bounded(str(type(ev).__struct_config__.tag), EVENT_TYPES)] += 1
        if isinstance(ev, Committed):
            self.commit_seconds.observe(ev.duration_s)
            for phase, seconds in ev.phases.items():
                self.phase_seconds.setdefault(bounded(phase, PHASES), Histogram()).observe(seconds)
        elif isinstance(ev, RecoveryDone):
            self.recovery_seconds.observe(ev.duration_s)
        elif isinstance(ev, MessageRejected):
            self.rejections[bounded(ev.reason, REJECT_REASONS)] += 1


class _FleetCollector(Collector):
    """Yields the metric families of the last status document and the aggregates."""

    def __init__(self, agg: EventAggregates) -> None:
        self.agg = agg
        self.status: Mapping[str, Any] | None = None
        self.sse_clients = 0

    def describe(self) -> list[Metric]:
        return []  # no names reserved up front: the registry must not call collect() early

    def collect(self) -> Iterator[Metric]:
        status = self.status
        if status is None:
            return
        fleet = str(status["fleet"])
        counters = status.get("counters", {})
        for name in COUNTERS:
            c = CounterMetricFamily(f"commitfleet_{name}", f"Fleet-wide {name} count.", labels=["fleet"])
            c.add_metric([fleet], float(counters.get(name, 0)))
            yield c
        rows = status["shard_table"]
        totals = status["totals"]
        gauges = {
            "commitfleet_workers": ("Live workers.", len(status["workers"])),
            # totals: from the shards' counts (GET /status), never a walk of the open work.
            "commitfleet_open_jobs": ("Jobs open in the shards' state.", totals["open_jobs"]),
            "commitfleet_pending_datasets": (
                "Datasets waiting or being committed.",
                totals["waiting"] + totals["queued"] + totals["running"] + totals["blocked"],
            ),
            "commitfleet_quarantined_datasets": ("Quarantined commit sequences.", totals["quarantined"]),
            "commitfleet_lag_entries": ("Entries not yet read, all shards.", sum(r["lag"] for r in rows)),
            "commitfleet_pending_entries": ("Entries read, not acked.", sum(r["pending"] for r in rows)),
            "commitfleet_dead_letters": ("Dead-letter entries.", sum(r["dead_letters"] for r in rows)),
            "commitfleet_assignment_epoch": ("Epoch of the shard assignment.", status["assignment_epoch"]),
            "commitfleet_admin_sse_clients": ("Event-stream clients of this coordinator.", self.sse_clients),
        }
        for metric, (doc, value) in gauges.items():
            g = GaugeMetricFamily(metric, doc, labels=["fleet"])
            g.add_metric([fleet], float(value))
            yield g
        lag = GaugeMetricFamily(
            "commitfleet_shard_lag_entries", "Entries not yet read.", labels=["fleet", "shard"]
        )
        for r in rows:
            lag.add_metric([fleet, str(int(r["shard"]))], float(r["lag"]))
        yield lag
        agg = self.agg
        ev = CounterMetricFamily(
            "commitfleet_admin_events", "Admin events seen by this coordinator.", labels=["fleet", "type"]
        )
        # Every label value of the closed sets is always there: the series never change.
        for t in (*EVENT_TYPES, OTHER):
            ev.add_metric([fleet, t], float(agg.events.get(t, 0)))
        yield ev
        rej = CounterMetricFamily(
            "commitfleet_rejections", "Rejected messages by reason code.", labels=["fleet", "reason"]
        )
        for reason in (*sorted(REJECT_REASONS), OTHER):
            rej.add_metric([fleet, reason], float(agg.rejections.get(reason, 0)))
        yield rej
        for name, doc, hist in (
            ("commitfleet_commit_duration_seconds", "Commit duration.", agg.commit_seconds),
            ("commitfleet_recovery_duration_seconds", "Recovery duration.", agg.recovery_seconds),
        ):
            h = HistogramMetricFamily(name, doc, labels=["fleet"])
            h.add_metric([fleet], hist.buckets(), hist.sum)
            yield h
        ph = HistogramMetricFamily(
            "commitfleet_commit_phase_seconds", "Seconds per commit phase.", labels=["fleet", "phase"]
        )
        for phase in (*PHASES, OTHER):
            hist = agg.phase_seconds.get(phase) or Histogram()
            ph.add_metric([fleet, phase], hist.buckets(), hist.sum)
        yield ph


class FleetMetrics:
    """The coordinator's metrics: one private registry, rendered per request."""

    def __init__(self) -> None:
        self.agg = EventAggregates()
        self._collector = _FleetCollector(self.agg)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self._collector)

    def render(self, status: Mapping[str, Any], *, sse_clients: int = 0) -> bytes:
        """Return the Prometheus text exposition for ``status`` and the aggregates."""
        self._collector.status = status
        self._collector.sse_clients = sse_clients
        return generate_latest(self.registry)


CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
