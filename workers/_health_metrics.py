"""The worker's own ``/metrics`` (Prometheus text format): its process, and what it knows cheaply.

The process (prometheus_client's collectors, read from ``/proc`` on Linux):
``process_resident_memory_bytes``, ``process_cpu_seconds_total``,
``process_open_fds``, ``process_max_fds``, ``process_virtual_memory_bytes``,
``process_start_time_seconds``, the garbage collector's
``python_gc_objects_collected_total``, ``python_gc_collections_total``... and
``python_info``. The worker's own gauges (README, "Worker metrics") carry no
label but ``worker`` (this process's id): nothing a message says becomes a label.
Rendering reads no Redis and no store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ._core import HealthMarks, Limits, livez, readyz
from ._health import HealthMonitor, WorkerStats

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


class _WorkerCollector(Collector):
    """The worker's gauges, read from its health monitor and its stats callable at each scrape."""

    def __init__(self, worker_id: str, monitor: HealthMonitor, stats: Callable[[], WorkerStats]) -> None:
        self._worker = worker_id
        self._monitor = monitor
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        m = self._monitor
        marks: HealthMarks = m.marks()
        limits: Limits = m.limits
        now = m.now()
        stats = self._stats()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["worker"])
            g.add_metric([self._worker], value)
            return g

        yield gauge("commitfleet_worker_shards_owned", "Shards this worker runs now", stats.shards_owned)
        yield gauge("commitfleet_worker_inflight", "Commits, aborts, recoveries running now", stats.inflight)
        yield gauge("commitfleet_worker_queued", "Work queued in this worker's shards", stats.queued)
        age = m.lease_age()
        yield gauge(
            "commitfleet_worker_lease_age_seconds",
            "Seconds since the membership lease was last written (-1: not a member)",
            -1.0 if age is None else age,
        )
        yield gauge("commitfleet_worker_loop_lag_seconds", "How late the loop's last tick was", m.last_lag)
        live, ready = livez(marks, limits, now).ok, readyz(marks, limits, now).ok
        yield gauge("commitfleet_worker_live", "1 when /livez answers 200", float(live))
        yield gauge("commitfleet_worker_ready", "1 when /readyz answers 200", float(ready))


class WorkerMetrics:
    """The registry ``/metrics`` renders: process, GC, platform and the worker's gauges."""

    def __init__(self, worker_id: str, monitor: HealthMonitor, stats: Callable[[], WorkerStats]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(_WorkerCollector(worker_id, monitor, stats))

    def render(self) -> bytes:
        """Return the metrics in Prometheus text format."""
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "WorkerMetrics"]
