"""JSON Schema of the queue and admin events, generated from the types.

The committed files under ``shared/schema/`` are what non-Python producers
read; ``python -m shared.events --check`` (and a unit test) fails when they
no longer match the types.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Final

import msgspec

from ._admin_events import AdminEvent
from ._queue_events import QueueEvent

SCHEMA_DIR: Final = Path(__file__).resolve().parent.parent / "schema"
QUEUE_SCHEMA_FILE: Final = SCHEMA_DIR / "queue-events.schema.json"
ADMIN_SCHEMA_FILE: Final = SCHEMA_DIR / "admin-events.schema.json"
_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"


def _plain(text: str) -> str:
    # Docstrings become descriptions: drop their indentation and reST quoting.
    return inspect.cleandoc(text).replace("``", "'")


def _schema(tp: Any, title: str, description: str) -> dict[str, Any]:
    schema: dict[str, Any] = msgspec.json.schema(tp)
    for definition in schema.get("$defs", {}).values():
        if "description" in definition:
            definition["description"] = _plain(definition["description"])
    schema["$schema"] = _DIALECT
    schema["title"] = title
    schema["description"] = description
    return schema


def queue_event_schema() -> dict[str, Any]:
    """Return the JSON Schema (draft 2020-12) of one queue event (the ``data`` field of a stream entry)."""
    return _schema(
        QueueEvent,
        "commitfleet queue event, v1",
        "One event of the commitfleet queue contract: the JSON in the 'data' field of a shard stream "
        "entry. The 'type' field selects the event; 'v' is the schema version (1).",
    )


def admin_event_schema() -> dict[str, Any]:
    """Return the JSON Schema (draft 2020-12) of one admin event (an admin stream entry's ``data``)."""
    return _schema(
        AdminEvent,
        "commitfleet admin event, v1",
        "One event of the commitfleet admin stream. The 'type' field selects the event; 'v' is the "
        "schema version (1).",
    )


def render_schema(schema: dict[str, Any]) -> str:
    """Return ``schema`` as stable text: sorted keys, two-space indent, trailing newline."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def expected_schema_files() -> dict[Path, str]:
    """Return each schema file's path and the text it must hold."""
    return {
        QUEUE_SCHEMA_FILE: render_schema(queue_event_schema()),
        ADMIN_SCHEMA_FILE: render_schema(admin_event_schema()),
    }


def stale_schema_files() -> list[Path]:
    """Return the schema files that are missing or differ from the types."""
    stale = []
    for path, text in expected_schema_files().items():
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        if current != text:
            stale.append(path)
    return stale


def write_schema_files() -> list[Path]:
    """Rewrite the schema files that are stale; return the paths written.

    Raises:
        OSError: the files cannot be written.
    """
    written = []
    files = expected_schema_files()
    for path in stale_schema_files():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path], encoding="utf-8")
        written.append(path)
    return written
