"""Tracing off (the default) runs no OpenTelemetry code of ours: in a fresh interpreter that loads the worker,
the commit core, the driver library and the CLI, and opens the settings' tracer, no module of ours imports
anything of OpenTelemetry (an import hook records who asks); turned on, the same tracer imports it, and
without the extra it is a one-line ConfigError.

redis-py (8.x) imports OpenTelemetry by itself when it is installed (its own opt-in observability, off
unless configured): that import is redis's, not ours, so the check is on the importer, not on sys.modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import json, sys

ASKED = []  # (module asked for, the module whose code asked)


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            frame = sys._getframe(1)
            machinery = ("importlib", "_frozen")
            while frame is not None and frame.f_globals.get("__name__", "").startswith(machinery):
                frame = frame.f_back
            ASKED.append((name, frame.f_globals.get("__name__", "?") if frame is not None else "?"))
        return None


sys.meta_path.insert(0, Watch())
import coordinator.cli, coordinator.admin, workers, shared.commit, shared.spark, shared.spark._job
import shared.spark._stream, workers._intake, workers._actions
from shared import load_settings
from shared.tracing import NO_TRACER, open_tracer
"""


def _run(code: str, env_extra: dict[str, str] | None = None) -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **(env_extra or {})}
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ours(asked: object) -> list[tuple[str, str]]:
    """The OpenTelemetry imports that code of ours asked for."""
    assert isinstance(asked, list)
    return [(m, by) for m, by in asked if by.split(".")[0] in ("shared", "workers", "coordinator")]


def test_tracing_off_imports_nothing_of_opentelemetry() -> None:
    got = _run(
        """
settings = load_settings(env={}, overrides={"store": {"url": "file:///tmp/x"}})
tracer = open_tracer(settings.tracing, service="t")
with tracer.span("x", attributes={"a": 1}) as s:
    s.set("b", 2)
    carrier = s.carrier()
tracer.record("y", start_ns=1, end_ns=2)
tracer.close()
print(json.dumps({"off": tracer is NO_TRACER, "carrier": carrier, "asked": ASKED}))
"""
    )
    assert got["off"] is True and got["carrier"] is None
    assert _ours(got["asked"]) == []


def test_tracing_on_uses_opentelemetry_and_exports_as_otel_variables_say() -> None:
    got = _run(
        """
settings = load_settings(env={"COMMITFLEET_TRACING_ENABLED": "true"}, overrides={"store": {"url": "file:///tmp/x"}})
tracer = open_tracer(settings.tracing, service="commitfleet-test")
with tracer.span("x") as s:
    carrier = s.carrier()
tracer.close()
print(json.dumps({"on": tracer.enabled, "carrier": carrier.traceparent, "asked": ASKED}))
""",
        {"OTEL_TRACES_EXPORTER": "none"},
    )
    assert got["on"] is True
    assert isinstance(got["carrier"], str) and got["carrier"].startswith("00-")
    assert ("opentelemetry.trace.propagation.tracecontext", "shared.tracing._otel") in {
        tuple(a) for a in _ours(got["asked"])
    }


def test_tracing_on_without_the_extra_is_a_config_error() -> None:
    got = _run(
        """
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from shared import ConfigError
from shared.settings import TracingSettings
try:
    open_tracer(TracingSettings(enabled=True), service="t")
except ConfigError as exc:
    print(json.dumps({"error": str(exc)}))
"""
    )
    assert "otel extra" in str(got["error"]) and "\\n" not in str(got["error"])


def test_otel_sdk_disabled_turns_tracing_off() -> None:
    got = _run(
        """
from shared.settings import TracingSettings
tracer = open_tracer(TracingSettings(enabled=True), service="t")
print(json.dumps({"off": tracer is NO_TRACER, "asked": ASKED}))
""",
        {"OTEL_SDK_DISABLED": "true"},
    )
    assert got["off"] is True and _ours(got["asked"]) == []
