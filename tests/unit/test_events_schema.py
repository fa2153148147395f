"""The committed JSON Schema files: up to date, and they accept what the codec accepts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shared.events import (
    InvalidMessage,
    admin_event_schema,
    check_rel_path,
    encode_admin,
    encode_event,
    queue_event_schema,
)
from shared.events._schema import ADMIN_SCHEMA_FILE, QUEUE_SCHEMA_FILE, render_schema
from tests._support.event_examples import ADMIN_EXAMPLES, EXAMPLES, raw, task_finished

ROOT = Path(__file__).resolve().parents[2]


def test_committed_schema_files_are_up_to_date() -> None:
    # If this fails: run `python -m shared.events --write` and commit shared/schema/.
    assert QUEUE_SCHEMA_FILE.read_text(encoding="utf-8") == render_schema(queue_event_schema())
    assert ADMIN_SCHEMA_FILE.read_text(encoding="utf-8") == render_schema(admin_event_schema())


def test_cli_check_and_print() -> None:
    run = [sys.executable, "-m", "shared.events"]
    check = subprocess.run([*run, "--check"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    printed = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(printed.stdout) == queue_event_schema()


def test_cli_check_fails_on_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.events import _schema
    from shared.events.__main__ import main

    stale = tmp_path / "queue-events.schema.json"
    stale.write_text("{}\n", encoding="utf-8")
    monkeypatch.setattr(_schema, "QUEUE_SCHEMA_FILE", stale)
    monkeypatch.setattr(_schema, "ADMIN_SCHEMA_FILE", tmp_path / "admin-events.schema.json")
    assert main(["--check"]) == 1
    assert main(["--write"]) == 0
    assert main(["--check"]) == 0
    assert json.loads(stale.read_text(encoding="utf-8")) == queue_event_schema()


def test_schema_is_a_valid_2020_12_schema() -> None:
    for schema in (queue_event_schema(), admin_event_schema()):
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


QUEUE = jsonschema.Draft202012Validator(queue_event_schema())


@pytest.mark.parametrize("ev", EXAMPLES, ids=lambda ev: type(ev).__name__)
def test_schema_accepts_every_example(ev: Any) -> None:
    QUEUE.validate(json.loads(encode_event(ev)))


def test_admin_schema_accepts_every_example() -> None:
    admin = jsonschema.Draft202012Validator(admin_event_schema())
    for ev in ADMIN_EXAMPLES:
        admin.validate(json.loads(encode_admin(ev)))


@pytest.mark.parametrize(
    "change",
    [
        {"type": "job_paused"},
        {"v": 2},
        {"extra": 1},
        {"task": -1},
        {"job": "../x"},
        {"dataset": "_wal"},
        {"files": [{"path": "a", "size": 1, "md5": "ABC"}]},
        {"files": [{"path": "../x", "size": 1}]},
        {"files": [{"path": "/etc/passwd", "size": 1}]},
        {"files": [{"path": "_commits/x", "size": 1}]},
        {"files": [{"path": "a\n", "size": 1}]},
    ],
)
def test_schema_rejects_what_the_codec_rejects(change: dict[str, Any]) -> None:
    assert not QUEUE.is_valid(raw(task_finished()) | change)


def test_schema_says_what_the_producer_must_send() -> None:
    defs = queue_event_schema()["$defs"]
    assert defs["TaskFinished"]["required"] == [
        "type",
        "job",
        "dataset",
        "task",
        "attempt",
        "files",
        "finished_at",
    ]
    assert defs["JobStarted"]["properties"]["datasets"]["minItems"] == 1


@settings(max_examples=300, deadline=None)
@given(
    path=st.lists(
        st.sampled_from(["", ".", "..", "_a", "a", ".a", "a\n", "\\", "\x01", "\x85", "é", "=", " "])
        | st.text(max_size=4),
        min_size=1,
        max_size=4,
    ).map("/".join)
)
def test_schema_path_pattern_agrees_with_the_validator(path: str) -> None:
    assume(all(len(seg.encode()) <= 255 for seg in path.split("/")))  # byte limits are not in the pattern
    doc = raw(task_finished()) | {"files": [{"path": path, "size": 1}]}
    try:
        check_rel_path(path)
    except InvalidMessage:
        accepted = False
    else:
        accepted = True
    assert QUEUE.is_valid(doc) == accepted
