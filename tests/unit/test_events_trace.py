"""The optional ``trace`` field of the job-level events: docs/contract.md's example and vectors hold for the
decoder and for the generated JSON Schema alike, and an event without it encodes as before."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import msgspec
import pytest

from shared.events import (
    InvalidMessage,
    JobFinished,
    JobStarted,
    TaskFinished,
    TraceContext,
    ValidationLimits,
    decode_event,
    encode_event,
    queue_event_schema,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text(encoding="utf-8")
SCHEMA = jsonschema.Draft202012Validator(queue_event_schema())
EXAMPLE_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _block(info: str) -> str:
    m = re.search(rf"```{re.escape(info)}\n(.*?)```", DOC, flags=re.S)
    assert m is not None, f"docs/contract.md has no {info!r} block"
    return m.group(1)


def _vectors() -> list[tuple[str, str]]:
    rows = [line.split(" ", 1) for line in _block("text trace-vectors").splitlines() if line]
    assert {verdict for verdict, _ in rows} == {"accept", "reject"}
    return [(verdict, value) for verdict, value in rows]


def _decode(doc: dict[str, object]) -> object:
    return decode_event(json.dumps(doc).encode(), sig=None, limits=ValidationLimits())


def test_the_contracts_trace_example_decodes_with_its_context() -> None:
    ev = decode_event(_block("json trace").strip().encode(), sig=None, limits=ValidationLimits())
    assert isinstance(ev, JobFinished)
    assert ev.trace == TraceContext(traceparent=EXAMPLE_PARENT, tracestate="vendor=opaque")
    SCHEMA.validate(json.loads(_block("json trace")))


@pytest.mark.parametrize(("verdict", "traceparent"), _vectors())
def test_trace_vectors_hold_for_the_decoder_and_the_schema(verdict: str, traceparent: str) -> None:
    doc = json.loads(_block("json trace"))
    doc["trace"] = {"traceparent": traceparent}
    if verdict == "accept":
        ev = _decode(doc)
        assert isinstance(ev, JobFinished) and isinstance(ev.trace, TraceContext)
        assert ev.trace.traceparent == traceparent and ev.trace.tracestate == ""
        SCHEMA.validate(doc)
    else:
        with pytest.raises(InvalidMessage) as err:
            _decode(doc)
        assert err.value.reason == "schema" and "$.trace.traceparent" in err.value.detail
        assert not SCHEMA.is_valid(doc)


@pytest.mark.parametrize(
    "trace",
    [None, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", {}, {"tracestate": "a=b"}],
    ids=["null", "string", "empty", "no-traceparent"],
)
def test_a_trace_of_the_wrong_shape_is_schema(trace: object) -> None:
    doc = json.loads(_block("json trace"))
    doc["trace"] = trace
    with pytest.raises(InvalidMessage) as err:
        _decode(doc)
    assert err.value.reason == "schema"
    assert not SCHEMA.is_valid(doc)


def test_tracestate_is_bounded_and_unknown_fields_refused() -> None:
    doc = json.loads(_block("json trace"))
    doc["trace"] = {"traceparent": EXAMPLE_PARENT, "tracestate": "k=" + "v" * 510}  # 512: the bound
    assert isinstance(_decode(doc), JobFinished)
    doc["trace"] = {"traceparent": EXAMPLE_PARENT, "tracestate": "k=" + "v" * 511}  # 513 characters
    with pytest.raises(InvalidMessage, match=r"\$\.trace\.tracestate"):
        _decode(doc)
    doc["trace"] = {"traceparent": EXAMPLE_PARENT, "baggage": "x"}
    with pytest.raises(InvalidMessage, match="baggage"):
        _decode(doc)
    assert not SCHEMA.is_valid(doc)


def test_task_finished_carries_no_trace() -> None:
    doc = {
        "type": "task_finished",
        "v": 1,
        "job": "j1",
        "dataset": "sales",
        "task": 0,
        "attempt": 0,
        "files": [],
        "finished_at": 1.0,
        "trace": {"traceparent": EXAMPLE_PARENT},
    }
    with pytest.raises(InvalidMessage) as err:
        _decode(doc)
    assert err.value.reason == "schema" and "trace" in err.value.detail
    assert not SCHEMA.is_valid(doc)
    assert "trace" not in TaskFinished.__struct_fields__


def test_an_event_without_trace_encodes_without_the_field() -> None:
    started = JobStarted(job="j1", datasets=["sales"], timeout_s=60, started_at=1.0)
    assert b"trace" not in encode_event(started)
    traced = msgspec.structs.replace(started, trace=TraceContext(traceparent=EXAMPLE_PARENT))
    data = encode_event(traced)
    assert json.loads(data)["trace"] == {"traceparent": EXAMPLE_PARENT}  # tracestate "" left out
    assert _decode(json.loads(data)) == traced
