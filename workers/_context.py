"""What every part of a worker process shares, passed down explicitly."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import redis.asyncio

from shared import Settings
from shared.events import AdminEvent, ValidationLimits
from shared.fleet import FleetRegistry
from shared.locks import SharedReleaseNotifier
from shared.queue import AdminPublisher, Keys, Outcome, redis_errors
from shared.storage import ObjectStore
from shared.tracing import NO_TRACER, TraceBook, Tracer

from ._probe import Probe, no_probe


@dataclass(slots=True)
class Counters:
    """Process-local counters, flushed to the fleet's metrics hash (HINCRBY) by the worker."""

    pending: Counter[str] = field(default_factory=Counter)

    def add(self, name: str, n: int = 1) -> None:
        """Count ``n`` more of ``name`` (e.g. ``intake``, ``rejected``, ``committed``)."""
        self.pending[name] += n

    def take(self) -> dict[str, int]:
        """Return and reset what was counted since the last call."""
        out = dict(self.pending)
        self.pending.clear()
        return out


@dataclass(slots=True)
class WorkerContext:
    """The worker's shared handles and settings (one per process)."""

    settings: Settings
    worker_id: str
    redis: redis.asyncio.Redis
    store: ObjectStore
    keys: Keys
    registry: FleetRegistry
    admin: AdminPublisher
    limits: ValidationLimits
    inflight: asyncio.Semaphore
    counters: Counters = field(default_factory=Counters)
    # Release notices from other processes (run by the worker); None: lock waiters poll only.
    notifier: SharedReleaseNotifier | None = None
    # Awaited at each named point of the commit path and intake (a test's hook; by default nothing).
    probe: Probe = no_probe
    # Spans (docs/tracing.md): the no-op tracer unless tracing.enabled; chosen once at start.
    tracer: Tracer = NO_TRACER
    # Each job's producer trace context, from its job-level events (only filled while tracing).
    traces: TraceBook = field(default_factory=TraceBook)

    async def emit(self, ev: AdminEvent) -> None:
        """Publish an admin event (retried inside the publisher; informational)."""
        await self.admin.publish(ev)

    async def emit_outcome(self, ev: AdminEvent, *, dataset: str, job: str, outcome: Outcome) -> bool:
        """Publish the ``committed`` / ``aborted`` event of (dataset, job) unless it is on the stream already.

        The marker, the entry and the exact count (``Keys.outcome_counts``)
        are written by one script (:meth:`AdminPublisher.publish_outcome`), so
        a worker that redoes or finds finished work after another one died
        calls this again and exactly one event results.

        Returns:
            True when this call appended the event.

        Raises:
            TransientError: Redis stayed unreachable (the caller retries the
                work; the marker keeps the retry from doubling the event).
        """
        return await self.admin.publish_outcome(ev, dataset=dataset, job=job, outcome=outcome)

    async def flush_counters(self) -> None:
        """Add the counters gathered since the last flush to ``cf:<fleet>:metrics``."""
        counts = self.counters.take()
        if not counts:
            return
        key = self.keys.fleet_key("metrics")
        try:
            with redis_errors("flush metrics"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for name, n in counts.items():
                        pipe.hincrby(key, name, n)
                    pipe.hset(key, "updated_at", repr(time.time()))
                    await pipe.execute()
        except BaseException:
            # Keep the counts for the next flush rather than lose them.
            for name, n in counts.items():
                self.counters.add(name, n)
            raise
