"""The tracer port: what commitfleet asks of a tracer, and the no-op tracer used when tracing is off.

Nothing here imports OpenTelemetry: with tracing off (the default, or without
the ``otel`` extra) a process runs :data:`NO_TRACER` and no tracing code of
OpenTelemetry is ever imported. The OpenTelemetry implementation is
:mod:`._otel`, chosen once at start by :func:`~shared.tracing.open_tracer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Protocol

AttrValue = str | int | float | bool
"""A span attribute's value."""

Attributes = Mapping[str, AttrValue]


@dataclass(frozen=True, slots=True)
class TraceCarrier:
    """A span context as W3C Trace Context headers: ``traceparent`` and (optional) ``tracestate``.

    What travels in a queue event's ``trace`` field (docs/contract.md) and is
    kept per job by the worker (:class:`~shared.tracing.TraceBook`).
    """

    traceparent: str
    tracestate: str = ""

    @property
    def trace_id(self) -> str:
        """The 32 hex digits of the trace id (the second field of ``traceparent``), or ``""``."""
        parts = self.traceparent.split("-")
        return parts[1] if len(parts) >= 4 else ""


class Span(Protocol):
    """One open span: attributes may be added while it runs."""

    def set(self, key: str, value: AttrValue) -> None:
        """Set attribute ``key`` of the span."""

    def carrier(self) -> TraceCarrier | None:
        """Return this span's context to send along (None when tracing is off)."""


class Tracer(Protocol):
    """What commitfleet records spans through; one per process, passed down explicitly."""

    @property
    def enabled(self) -> bool:
        """True when spans are recorded (callers may skip work that only feeds spans)."""

    def span(
        self, name: str, *, parent: TraceCarrier | None = None, attributes: Attributes | None = None
    ) -> AbstractContextManager[Span]:
        """Return a context manager that opens span ``name`` for its block (current in it).

        ``parent``: a producer's context (the span is its child); None: the
        span opened around this one in the same task, if any. An exception
        leaving the block is recorded on the span and passed on unchanged
        (cancellation too).
        """

    def record(
        self,
        name: str,
        *,
        start_ns: int,
        end_ns: int,
        parent: TraceCarrier | None = None,
        attributes: Attributes | None = None,
    ) -> None:
        """Record a span that already ended (``time.time_ns()`` values), e.g. a lock wait."""

    def close(self) -> None:
        """Flush what is buffered and stop exporting (blocking; bounded by ``OTEL_BSP_EXPORT_TIMEOUT``)."""


class _NoSpan:
    __slots__ = ()

    def set(self, key: str, value: AttrValue) -> None:
        return None

    def carrier(self) -> TraceCarrier | None:
        return None

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


_NO_SPAN: Final = _NoSpan()


class NoTracer:
    """The tracer of a process with tracing off: records nothing, allocates nothing per span."""

    __slots__ = ()

    @property
    def enabled(self) -> bool:
        return False

    def span(
        self, name: str, *, parent: TraceCarrier | None = None, attributes: Attributes | None = None
    ) -> AbstractContextManager[Span]:
        return _NO_SPAN

    def record(
        self,
        name: str,
        *,
        start_ns: int,
        end_ns: int,
        parent: TraceCarrier | None = None,
        attributes: Attributes | None = None,
    ) -> None:
        return None

    def close(self) -> None:
        return None


NO_TRACER: Final[Tracer] = NoTracer()
"""The tracer when tracing is off."""

__all__ = ["NO_TRACER", "AttrValue", "Attributes", "NoTracer", "Span", "TraceCarrier", "Tracer"]
