"""Choosing the process's tracer once at start: the no-op one, or OpenTelemetry's."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from ..settings import TracingSettings
from ._port import NO_TRACER, Tracer

if TYPE_CHECKING:
    from ._otel import OtelTracer


def open_tracer(settings: TracingSettings, *, service: str) -> Tracer:
    """Return the tracer ``settings`` ask for: :data:`NO_TRACER` unless ``tracing.enabled``.

    Off also when ``OTEL_SDK_DISABLED=true`` (the SDK's own switch). On, a new
    ``TracerProvider`` exports as the ``OTEL_*`` variables say (see
    :func:`shared.tracing._otel.sdk_tracer`); ``service`` is the service name
    when ``OTEL_SERVICE_NAME`` gives none. The caller closes it at exit.

    Raises:
        ConfigError: tracing is on and the ``otel`` extra is not installed, or
            an ``OTEL_*`` variable names what this build does not ship.
    """
    if not settings.enabled or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return NO_TRACER
    try:
        from ._otel import sdk_tracer
    except ImportError as exc:
        raise ConfigError(
            f"tracing.enabled needs the otel extra (pip install 'commitfleet[otel]'): {exc}"
        ) from None
    return sdk_tracer(service)


def otel_tracer(provider: Any) -> OtelTracer:
    """Return a tracer over an OpenTelemetry ``TracerProvider`` the caller owns (a driver's own set-up,
    a test's in-memory exporter); its :meth:`~shared.tracing.Tracer.close` only flushes.

    Raises:
        ConfigError: the ``otel`` extra is not installed.
    """
    try:
        from ._otel import OtelTracer
    except ImportError as exc:
        raise ConfigError(f"the otel extra is not installed: {exc}") from None
    return OtelTracer(provider)


__all__ = ["open_tracer", "otel_tracer"]
