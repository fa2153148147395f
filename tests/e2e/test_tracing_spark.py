"""Traces across processes: a real PySpark driver's job span -> the worker process's spans, one trace.

The driver (this process, a local SparkSession) records into the SDK's
in-memory exporter; the worker is a real process with ``tracing.enabled`` that
exports OTLP/HTTP to a stand-in collector started here
(tests/_support/otlp_collector.py). The job's ``traceparent`` travels in its
queue events; the worker's commit span must be a child of the driver's
``commitfleet.job`` span, and every span of the job share its trace id.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from shared.events import JobFinished, JobStarted, QueueEvent, ValidationLimits, decode_entry
from shared.queue import Keys, ensure_fleet_sync
from shared.spark import ProducerConfig, commit_job
from shared.tracing import otel_tracer
from tests._support.fleet import fleet_settings
from tests._support.otlp_collector import Collector, ReceivedSpan, otlp_collector
from tests._support.processes import FleetProcess, fleet_processes, write_config
from tests._support.redis_server import RedisHandle
from tests._support.spark import spark_session_fixture
from tests._support.wait import wait_for_sync

# Its own marker (make traces): a minute of Spark on top of the in-process tracing tests of the default run.
pytestmark = [pytest.mark.spark, pytest.mark.traces]

spark = spark_session_fixture("test-tracing", master="local[2]")

SHARDS = 2


class Fleet(msgspec.Struct):
    name: str
    url: str
    producer: ProducerConfig
    collector: Collector
    procs: list[FleetProcess]


@pytest.fixture(scope="module")
def traced_fleet(redis_server: RedisHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = tmp_path_factory.mktemp("tracing-fleet")
    (base / "store").mkdir()
    logs = base / "logs"
    logs.mkdir()
    settings = fleet_settings(
        redis_server.url,
        base / "store",
        "tr" + secrets.token_hex(4),
        shards=SHARDS,
        tracing={"enabled": True},
    )
    config = write_config(settings, base / "fleet.toml")
    client = redis.Redis.from_url(settings.redis.url)
    try:
        ensure_fleet_sync(client, settings.fleet.name, SHARDS)
    finally:
        client.close()
    producer = ProducerConfig.from_settings(settings, job_timeout=30.0, app="tracing")
    producer = msgspec.structs.replace(producer, wait_timeout=90.0)
    with otlp_collector() as collector, fleet_processes(logs) as procs:
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_SERVICE_NAME": "fleet-worker-under-test",
        }
        procs.append(FleetProcess("coordinator", "c1", config, logs))
        procs.append(FleetProcess("worker", "w1", config, logs, env=otel))
        yield Fleet(settings.fleet.name, settings.redis.url, producer, collector, procs)


def _job_events(url: str, fleet: str, job: str) -> list[QueueEvent]:
    client = redis.Redis.from_url(url)
    try:
        out: list[QueueEvent] = []
        keys = Keys(fleet)
        for shard in range(SHARDS):
            for entry_id, fields in client.xrange(keys.events(shard)):
                ev = decode_entry(
                    fields, limits=ValidationLimits(), stream=keys.events(shard), entry_id=entry_id
                )
                if ev.job == job:
                    out.append(ev)
        return out
    finally:
        client.close()


def test_a_spark_jobs_driver_span_is_the_parent_of_the_worker_processs_commit_spans(
    spark: Any, traced_fleet: Fleet, tmp_path: Path
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = otel_tracer(provider)
    datasets = ["traced_a", "traced_b"]
    df = spark.createDataFrame([(i, f"n{i}") for i in range(20)], "id long, name string").repartition(2)
    with (
        tracer.span("pipeline") as outer,
        commit_job(spark, datasets=datasets, config=traced_fleet.producer, tracer=tracer) as job,
    ):
        for ds in datasets:
            job.write_dataset(df, ds)
    assert {r.status for r in job.results.values()} == {"committed"}
    driver = {s.name: s for s in memory.get_finished_spans()}
    job_span = driver["commitfleet.job"]
    trace_id = format(job_span.context.trace_id, "032x")
    span_id = format(job_span.context.span_id, "016x")
    # The job span is the caller's span's child; its writes and the wait are its children.
    outer_carrier = outer.carrier()
    assert outer_carrier is not None and outer_carrier.trace_id == trace_id
    assert job_span.attributes is not None and job_span.attributes["commitfleet.job"] == job.job_id
    for name in ("commitfleet.write", "commitfleet.wait"):
        assert driver[name].parent is not None and driver[name].parent.span_id == job_span.context.span_id

    # The traceparent arrived: every job-level event of the job on the streams carries the job span.
    evs = _job_events(traced_fleet.url, traced_fleet.name, job.job_id)
    job_level = [e for e in evs if isinstance(e, JobStarted | JobFinished)]
    assert job_level
    for e in job_level:  # the flags (sampled, random id) are the SDK's
        assert e.trace is not msgspec.UNSET and e.trace.traceparent.startswith(f"00-{trace_id}-{span_id}-")

    # The worker process exported its spans of the job in the same trace, the commits under the job span.
    def commits() -> list[ReceivedSpan]:
        got = [
            s
            for s in traced_fleet.collector.spans()
            if s.name == "commitfleet.commit" and s.attributes.get("commitfleet.job") == job.job_id
        ]
        return got if len(got) == len(datasets) else []

    spans = wait_for_sync(commits, timeout=30, what="the worker's commit spans at the collector")
    assert {s.attributes["commitfleet.dataset"] for s in spans} == set(datasets)
    assert all(s.trace_id == trace_id and s.parent == span_id for s in spans)
    assert all(s.service == "fleet-worker-under-test" for s in spans)  # OTEL_SERVICE_NAME was read
    worker = [s for s in traced_fleet.collector.spans() if s.trace_id == trace_id]
    names = {s.name for s in worker}
    assert {
        "commitfleet.intake",
        "commitfleet.lock_wait",
        "commitfleet.publish",
        "commitfleet.manifest",
    } <= names
    for p in traced_fleet.procs:
        assert p.proc.poll() is None, f"{p.name} exited: {p.output()[-3000:]}"
