"""The OpenTelemetry tracer (the ``otel`` extra): spans through an explicit ``TracerProvider``.

Imported only when tracing is on (:func:`~shared.tracing.open_tracer`) or a
caller hands in its own provider (:func:`~shared.tracing.otel_tracer`). The
provider is ours, never the SDK's global one: a driver that has its own
OpenTelemetry set-up keeps it, and its current span becomes the parent of the
job's span. Exporters are configured by the standard ``OTEL_*`` variables
(docs/tracing.md).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .._errors import ConfigError
from ._port import Attributes, AttrValue, Span, TraceCarrier

INSTRUMENTATION: Final = "commitfleet"
_PROPAGATOR: Final = TraceContextTextMapPropagator()


class _OtelSpan:
    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, key: str, value: AttrValue) -> None:
        self._span.set_attribute(key, value)

    def carrier(self) -> TraceCarrier | None:
        return carrier_of(self._span)


class _Current:
    """A span started on entry and current (the OpenTelemetry context attached) until exit.

    What ``start_as_current_span`` does, without its two generator layers (a
    fifth less per span). An ``Exception`` leaving the block is recorded with
    status ``ERROR``; a ``BaseException`` (cancellation) only ends the span.
    """

    __slots__ = ("_attributes", "_name", "_parent", "_span", "_token", "_tracer")

    def __init__(
        self, tracer: trace.Tracer, name: str, parent: TraceCarrier | None, attributes: Attributes | None
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._parent = parent
        self._attributes = attributes

    def __enter__(self) -> Span:
        span = self._tracer.start_span(
            self._name, context=context_of(self._parent), attributes=self._attributes
        )
        self._span = span
        self._token = otel_context.attach(trace.set_span_in_context(span))
        return _OtelSpan(span)

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        otel_context.detach(self._token)
        span = self._span
        if isinstance(ev, Exception):
            span.record_exception(ev)
            span.set_status(Status(StatusCode.ERROR, f"{type(ev).__name__}: {ev}"))
        span.end()


def carrier_of(span: trace.Span) -> TraceCarrier | None:
    """Return ``span``'s context as W3C headers, or None when it has no valid context."""
    headers: dict[str, str] = {}
    _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
    parent = headers.get("traceparent")
    return None if parent is None else TraceCarrier(parent, headers.get("tracestate", ""))


def context_of(carrier: TraceCarrier | None) -> Context | None:
    """Return the OpenTelemetry context whose remote parent is ``carrier``; None: the current one.

    A ``traceparent`` OpenTelemetry cannot read gives None too (the span then
    hangs under the current one, or starts a trace); the contract's schema
    refuses such a value before it gets here.
    """
    if carrier is None:
        return None
    headers = {"traceparent": carrier.traceparent}
    if carrier.tracestate:
        headers["tracestate"] = carrier.tracestate
    ctx = _PROPAGATOR.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


class OtelTracer:
    """The :class:`~shared.tracing.Tracer` over an OpenTelemetry ``TracerProvider``.

    ``owned``: :meth:`close` shuts the provider down (flushing its
    processors); a provider handed in by the caller is only flushed.
    """

    def __init__(self, provider: trace.TracerProvider, *, owned: bool = False) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION)
        self._owned = owned

    @property
    def enabled(self) -> bool:
        return True

    @property
    def provider(self) -> trace.TracerProvider:
        """The provider spans go to."""
        return self._provider

    def span(
        self, name: str, *, parent: TraceCarrier | None = None, attributes: Attributes | None = None
    ) -> AbstractContextManager[Span]:
        return _Current(self._tracer, name, parent, attributes)

    def record(
        self,
        name: str,
        *,
        start_ns: int,
        end_ns: int,
        parent: TraceCarrier | None = None,
        attributes: Attributes | None = None,
    ) -> None:
        s = self._tracer.start_span(
            name, context=context_of(parent), attributes=attributes, start_time=start_ns
        )
        s.end(end_time=max(start_ns, end_ns))

    def close(self) -> None:
        if self._owned:
            shutdown = getattr(self._provider, "shutdown", None)
            if shutdown is not None:
                shutdown()
            return
        flush = getattr(self._provider, "force_flush", None)
        if flush is not None:
            flush()


def sdk_tracer(service: str) -> OtelTracer:
    """Return a tracer over a new SDK ``TracerProvider`` exporting as the ``OTEL_*`` variables say.

    ``OTEL_TRACES_EXPORTER``: ``otlp`` (default; OTLP over HTTP/protobuf,
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
    headers, timeout, compression as the exporter reads them), ``console``,
    or ``none``. The sampler (``OTEL_TRACES_SAMPLER``, default parent-based
    always-on), the batch processor (``OTEL_BSP_*``) and the resource
    (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``; ``service`` when
    neither names the service) are the SDK's.

    Raises:
        ConfigError: an exporter or protocol this build does not ship.
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    resource = Resource.create({})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource)
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    for name in names:
        exporter: SpanExporter
        if name == "none":
            continue
        if name == "console":
            exporter = ConsoleSpanExporter()
        elif name == "otlp":
            protocol = os.environ.get(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
            )
            if protocol not in ("", "http/protobuf"):
                raise ConfigError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: only http/protobuf is supported"
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        else:
            raise ConfigError(f"OTEL_TRACES_EXPORTER={name!r}: supported are otlp, console, none")
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return OtelTracer(provider, owned=True)


__all__ = ["OtelTracer", "carrier_of", "context_of", "sdk_tracer"]
