"""Traces through an in-process fleet: a producer's span -> the worker's intake, commit, phase, lock and
abort spans, one trace per job, recorded by the SDK's in-memory exporter (docs/tracing.md)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Iterator
from pathlib import Path

import msgspec
import pytest
import redis.asyncio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.events import (
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    TaskFinished,
    TraceContext,
    encode_event,
)
from shared.queue import DeadLetter
from shared.tracing import TraceCarrier, otel_tracer
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import committed, no_staging_left
from tests._support.fleet_jobs import failed_job, good_job
from tests._support.routing import dataset_on
from tests._support.wait import wait_for

SHARDS = 4


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.shutdown()


def _traced(evs: list[QueueEvent], carrier: TraceCarrier) -> list[QueueEvent]:
    """The events as a tracing producer sends them: the job-level ones carry ``trace``."""
    trace = TraceContext(traceparent=carrier.traceparent, tracestate=carrier.tracestate)
    job_level = (JobStarted, JobFinished, JobFailed)
    return [msgspec.structs.replace(e, trace=trace) if isinstance(e, job_level) else e for e in evs]


def _named(spans: tuple[ReadableSpan, ...], name: str, job: str | None = None) -> list[ReadableSpan]:
    return [
        s
        for s in spans
        if s.name == name and (job is None or (s.attributes or {}).get("commitfleet.job") == job)
    ]


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


async def test_a_jobs_worker_spans_join_its_producer_trace(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    exporter: InMemorySpanExporter,
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = otel_tracer(provider)
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=SHARDS)
    good = [dataset_on(0, SHARDS), dataset_on(1, SHARDS)]
    bad = [dataset_on(2, SHARDS)]
    async with inprocess_fleet(redis_client, settings, tracer=tracer) as fleet:
        # The producer's side: a span per job, its context sent in the job-level events.
        with tracer.span("driver.job-ok") as driver_ok:
            ok_carrier = driver_ok.carrier()
        with tracer.span("driver.job-bad") as driver_bad:
            bad_carrier = driver_bad.carrier()
        assert ok_carrier is not None and bad_carrier is not None
        assert ok_carrier.trace_id != bad_carrier.trace_id
        await fleet.publisher.publish_many(
            _traced(await good_job(fleet.store, "ok", good, tasks=3), ok_carrier)
        )
        await fleet.publisher.publish_many(
            _traced(await failed_job(fleet.store, "bad", bad, tasks=2), bad_carrier)
        )
        # An untraced job still commits (its spans are roots of their own).
        await fleet.publisher.publish_many(await good_job(fleet.store, "plain", good, tasks=1))
        await wait_for(lambda: committed(fleet.store, good, "ok"), timeout=60, what="traced job committed")
        await wait_for(lambda: committed(fleet.store, good, "plain"), timeout=60, what="plain job committed")
        await wait_for(lambda: no_staging_left(fleet.store, "bad"), timeout=60, what="failed job cleaned")

        def commits_and_aborts() -> bool:
            spans = exporter.get_finished_spans()
            return len(_named(spans, "commitfleet.commit", "ok")) == 2 and len(
                _named(spans, "commitfleet.abort", "bad")
            ) == len(bad)

        async def ended() -> bool:
            return commits_and_aborts()

        await wait_for(ended, timeout=30, what="commit and abort spans ended")
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    ok_trace = int(ok_carrier.trace_id, 16)

    # Every commit span of the job is a child of the producer's span, in its trace.
    commits = _named(spans, "commitfleet.commit", "ok")
    assert {c.attributes["commitfleet.dataset"] for c in commits} == set(good)  # type: ignore[index]
    for c in commits:
        assert c.context.trace_id == ok_trace
        assert c.parent is not None and _hex(c.parent.span_id, 16) == ok_carrier.traceparent.split("-")[2]
        assert c.attributes["commitfleet.status"] == "committed"  # type: ignore[index]
        # Its phases and its lock wait are its children.
        children = {s.name for s in spans if s.parent is not None and s.parent.span_id == c.context.span_id}
        assert {"commitfleet.publish", "commitfleet.apply", "commitfleet.manifest"} <= children, children
        assert "commitfleet.lock_wait" in children
    # Intake: one span per job-level event and shard copy, under the producer's span.
    intake = _named(spans, "commitfleet.intake", "ok")
    kinds = sorted(str(s.attributes["commitfleet.event"]) for s in intake)  # type: ignore[index]
    assert kinds == ["job_finished"] * 2 + ["job_started"] * 2, kinds
    assert all(s.context.trace_id == ok_trace for s in intake)
    # One trace per job: every span naming the job is in the producer's trace.
    assert {s.context.trace_id for s in spans if (s.attributes or {}).get("commitfleet.job") == "ok"} == {
        ok_trace
    }
    # The failed job: its abort spans are in its own trace.
    (abort,) = _named(spans, "commitfleet.abort", "bad")
    assert abort.context.trace_id == int(bad_carrier.trace_id, 16)
    assert abort.attributes["commitfleet.status"] == "aborted"  # type: ignore[index]
    # The untraced job: spans of its own, no producer parent, not in either trace.
    plain = _named(spans, "commitfleet.commit", "plain")
    assert len(plain) == 2
    assert all(p.parent is None and p.context.trace_id != ok_trace for p in plain)
    # Phase spans hang under a span of the fleet, never loose.
    for s in _named(spans, "commitfleet.publish"):
        assert s.parent is not None and by_id[s.parent.span_id].name == "commitfleet.commit"


async def test_a_commit_after_a_worker_restart_still_joins_its_producer_trace(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    exporter: InMemorySpanExporter,
) -> None:
    """The job's context is saved with its state: a new worker, whose memory never saw the job's
    events (they were acknowledged), still hangs the commit under the producer's span."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = otel_tracer(provider)
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=SHARDS)
    ds = dataset_on(0, SHARDS)
    with tracer.span("driver.job-late") as driver:
        carrier = driver.carrier()
    assert carrier is not None
    async with inprocess_fleet(redis_client, settings, tracer=tracer) as fleet:
        evs = _traced(await good_job(fleet.store, "late", [ds], tasks=2, duplicate_attempt=False), carrier)
        last = next(e for e in evs if isinstance(e, TaskFinished) and e.task == 1)
        await fleet.publisher.publish_many([e for e in evs if e is not last])

        async def waiting() -> bool:  # the job finished and waits for its last task
            return len(_named(exporter.get_finished_spans(), "commitfleet.intake", "late")) == 2

        await wait_for(waiting, timeout=60, what="the job's events taken in")
    async with inprocess_fleet(redis_client, settings, tracer=tracer, workers=("w2",)) as fleet:
        await fleet.publisher.publish_many([last])
        await wait_for(
            lambda: committed(fleet.store, [ds], "late"), timeout=60, what="committed after restart"
        )

        async def commit_span() -> bool:
            return len(_named(exporter.get_finished_spans(), "commitfleet.commit", "late")) == 1

        await wait_for(commit_span, timeout=30, what="the commit span ended")
    (commit,) = _named(exporter.get_finished_spans(), "commitfleet.commit", "late")
    assert commit.context.trace_id == int(carrier.trace_id, 16)
    assert commit.parent is not None and _hex(commit.parent.span_id, 16) == carrier.traceparent.split("-")[2]


async def test_a_malformed_trace_context_is_dead_lettered_and_the_shard_goes_on(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    exporter: InMemorySpanExporter,
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=SHARDS)
    ds = dataset_on(3, SHARDS)
    async with inprocess_fleet(redis_client, settings, tracer=otel_tracer(provider)) as fleet:
        started = JobStarted(job="odd", datasets=[ds], timeout_s=600, started_at=1.0)
        good = json.loads(encode_event(started))
        bad_version = {**good, "trace": {"traceparent": "ff-" + "1" * 32 + "-" + "2" * 16 + "-01"}}
        upper = {**good, "job": "odd2", "trace": {"traceparent": "00-" + "A" * 32 + "-" + "2" * 16 + "-01"}}
        await fleet.publisher.publish_fields(
            [(3, {"data": json.dumps(doc).encode()}) for doc in (bad_version, upper)]
        )
        await wait_for(lambda: _two(fleet.dead(3)), timeout=30, what="both dead letters")
        dead = await fleet.dead(3)
        assert [d.reason for d in dead] == ["schema", "schema"]
        assert all("$.trace.traceparent" in d.detail for d in dead)
        # The shard reads on: a traced job behind them commits, with its spans.
        with otel_tracer(provider).span("driver") as driver:
            carrier = driver.carrier()
        assert carrier is not None
        await fleet.publisher.publish_many(
            _traced(await good_job(fleet.store, "after", [ds], tasks=1), carrier)
        )
        await wait_for(lambda: committed(fleet.store, [ds], "after"), timeout=60, what="commit after them")

        async def commit_span() -> list[ReadableSpan]:
            return _named(exporter.get_finished_spans(), "commitfleet.commit", "after")

        (span,) = await wait_for(commit_span, timeout=30, what="the commit span")
        assert span.context.trace_id == int(carrier.trace_id, 16)
    # Nothing of the rejected events made a span.
    assert not [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("commitfleet.job") in ("odd", "odd2")
    ]


async def _two(dead: Awaitable[list[DeadLetter]]) -> bool:
    return len(await dead) == 2
