"""The OpenTelemetry tracer behind the port: parents, nesting, errors and cancellations, finished spans;
and the worker's bounded book of job contexts."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from shared.tracing import NO_TRACER, TraceBook, TraceCarrier, Tracer, otel_tracer

PARENT = TraceCarrier("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=opaque")


@pytest.fixture
def traced() -> tuple[Tracer, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return otel_tracer(provider), memory


def test_a_given_parent_wins_and_inner_spans_nest(traced: tuple[Tracer, InMemorySpanExporter]) -> None:
    tracer, memory = traced
    with tracer.span("outer", parent=PARENT, attributes={"a": 1}) as outer:
        outer.set("b", "x")
        carrier = outer.carrier()
        with tracer.span("inner"):
            tracer.record("done", start_ns=10, end_ns=5)  # an end before the start is clamped
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert format(spans["outer"].context.trace_id, "032x") == PARENT.trace_id
    assert (
        spans["outer"].parent is not None
        and format(spans["outer"].parent.span_id, "016x") == "00f067aa0ba902b7"
    )
    assert spans["outer"].attributes == {"a": 1, "b": "x"}
    assert (
        carrier is not None and carrier.trace_id == PARENT.trace_id and carrier.tracestate == "vendor=opaque"
    )
    assert (
        spans["inner"].parent is not None and spans["inner"].parent.span_id == spans["outer"].context.span_id
    )
    assert spans["done"].parent is not None and spans["done"].parent.span_id == spans["inner"].context.span_id
    assert (spans["done"].start_time, spans["done"].end_time) == (10, 10)


def test_an_error_is_recorded_and_passed_on_a_cancellation_only_ends_the_span(
    traced: tuple[Tracer, InMemorySpanExporter],
) -> None:
    tracer, memory = traced
    with pytest.raises(ValueError, match="boom"), tracer.span("fails"):
        raise ValueError("boom")

    async def cancelled() -> None:
        with tracer.span("cancelled"):
            await asyncio.sleep(3600)

    async def run() -> None:
        task = asyncio.create_task(cancelled())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert spans["fails"].status.status_code is StatusCode.ERROR
    assert [e.name for e in spans["fails"].events] == ["exception"]
    assert spans["cancelled"].status.status_code is StatusCode.UNSET and not spans["cancelled"].events


def test_the_no_op_tracer_gives_no_context() -> None:
    with NO_TRACER.span("x", parent=PARENT) as span:
        span.set("a", 1)
        assert span.carrier() is None
    assert NO_TRACER.enabled is False


def test_the_book_forgets_the_oldest_job_first() -> None:
    book = TraceBook(size=2)
    book.note("a", PARENT)
    book.note("b", PARENT)
    book.note("a", TraceCarrier(PARENT.traceparent))  # a again: now the newest
    book.note("c", PARENT)
    assert book.get("b") is None and book.get("a") == TraceCarrier(PARENT.traceparent)
    assert book.get("c") == PARENT and len(book) == 2
