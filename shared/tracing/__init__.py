"""Traces: the tracer port, its no-op and OpenTelemetry implementations, the per-job trace contexts.

Importing this package imports nothing of OpenTelemetry; only a tracer that is
on (:func:`open_tracer` with ``tracing.enabled``, or :func:`otel_tracer`)
does. See docs/tracing.md.
"""

from ._book import BOOK_SIZE, TraceBook
from ._open import open_tracer, otel_tracer
from ._port import NO_TRACER, Attributes, AttrValue, NoTracer, Span, TraceCarrier, Tracer

__all__ = [
    "BOOK_SIZE",
    "NO_TRACER",
    "AttrValue",
    "Attributes",
    "NoTracer",
    "Span",
    "TraceBook",
    "TraceCarrier",
    "Tracer",
    "open_tracer",
    "otel_tracer",
]
