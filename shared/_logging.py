"""Structured logs: one JSON object per line when stderr is not a terminal.

Call :func:`configure_logging` once at process start. Code logs with the
standard library and passes structured fields through ``extra={"fields": {...}}``
(see :func:`kv`), so a log line carries dataset, job, shard, worker, durations.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from .settings import LogSettings

_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def kv(**fields: Any) -> dict[str, Any]:
    """Return ``extra=`` for a log call carrying ``fields`` as structured data."""
    return {"fields": fields}


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON line: ts, level, logger, msg, and its fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key != "fields" and not key.startswith("_"):
                out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """Human format for terminals: time, level, logger, message, key=value fields."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        fields = getattr(record, "fields", None)
        tail = ""
        if isinstance(fields, dict) and fields:
            tail = " " + " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()}{tail}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(settings: LogSettings, *, stream: Any = None) -> None:
    """Install one handler on the root logger according to ``settings``.

    Safe to call twice (the previous commitfleet handler is replaced).
    """
    stream = stream or sys.stderr
    fmt = settings.format
    if fmt == "auto":
        fmt = "text" if getattr(stream, "isatty", lambda: False)() else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.set_name("commitfleet")
    root = logging.getLogger()
    for h in list(root.handlers):
        if h.get_name() == "commitfleet":
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(settings.level)
    # Third-party clients are chatty at INFO.
    for noisy in ("botocore", "aiobotocore", "azure", "urllib3", "py4j", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(settings.level)))


__all__ = ["JsonFormatter", "TextFormatter", "configure_logging", "kv"]
