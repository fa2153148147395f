"""Event helpers (restrict_to, event_datasets, event_type) and the admin events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared import BadInput
from shared.events import (
    ADMIN_EVENT_TYPES,
    QUEUE_EVENT_TYPES,
    AdminEvent,
    DatasetExpectation,
    InvalidMessage,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    JobTimedOut,
    StagedFile,
    TaskFinished,
    WorkerLeft,
    decode_admin,
    encode_admin,
    event_datasets,
    event_type,
    restrict_to,
)
from tests._support.event_examples import ADMIN_EXAMPLES

STARTED = JobStarted(job="j1", datasets=["a", "b", "c"], timeout_s=60, started_at=1.0)
FINISHED = JobFinished(
    job="j1",
    datasets={"a": DatasetExpectation(tasks=1), "b": DatasetExpectation(tasks=2, winners=[0, 1])},
    finished_at=2.0,
)
TASK = TaskFinished(
    job="j1", dataset="b", task=0, attempt=0, files=[StagedFile(path="x", size=1)], finished_at=1.5
)


def test_event_datasets() -> None:
    assert event_datasets(STARTED) == ["a", "b", "c"]
    assert event_datasets(FINISHED) == ["a", "b"]
    assert event_datasets(TASK) == ["b"]
    assert event_datasets(JobFailed(job="j", datasets=["z"], reason="", failed_at=0)) == ["z"]


def test_restrict_to_keeps_order_and_only_the_shard_datasets() -> None:
    assert restrict_to(STARTED, {"c", "a", "zz"}) == JobStarted(
        job="j1", datasets=["a", "c"], timeout_s=60, started_at=1.0
    )
    assert restrict_to(FINISHED, {"b"}) == JobFinished(
        job="j1", datasets={"b": DatasetExpectation(tasks=2, winners=[0, 1])}, finished_at=2.0
    )
    cancelled = JobCancelled(job="j", datasets=["a", "b"], reason="user", cancelled_at=3.0)
    assert restrict_to(cancelled, frozenset({"b"})) == JobCancelled(
        job="j", datasets=["b"], reason="user", cancelled_at=3.0
    )


def test_restrict_to_returns_the_same_event_when_nothing_is_removed() -> None:
    assert restrict_to(STARTED, {"a", "b", "c", "d"}) is STARTED
    assert restrict_to(FINISHED, {"a", "b"}) is FINISHED
    assert restrict_to(TASK, {"b"}) is TASK


def test_restrict_to_refuses_an_event_with_nothing_left() -> None:
    for ev in (STARTED, FINISHED, TASK):
        with pytest.raises(BadInput, match="no dataset in the given set"):
            restrict_to(ev, {"other"})


def test_restricted_copies_partition_the_job_level_event() -> None:
    shards = [{"a"}, {"b", "c"}]
    parts = [event_datasets(restrict_to(STARTED, s)) for s in shards]
    assert sorted(d for p in parts for d in p) == sorted(event_datasets(STARTED))


def test_event_type_and_registry() -> None:
    assert event_type(TASK) == "task_finished"
    assert set(QUEUE_EVENT_TYPES) == {
        "job_started",
        "task_finished",
        "job_finished",
        "job_failed",
        "job_cancelled",
    }
    for tag, cls in QUEUE_EVENT_TYPES.items():
        assert cls.__struct_config__.tag == tag


# -- admin events ----------------------------------------------------------------------------------


def test_every_admin_type_has_an_example() -> None:
    assert {type(ev) for ev in ADMIN_EXAMPLES} == set(ADMIN_EVENT_TYPES.values())


@pytest.mark.parametrize("ev", ADMIN_EXAMPLES, ids=lambda ev: type(ev).__name__)
def test_admin_round_trip(ev: AdminEvent) -> None:
    data = encode_admin(ev)
    doc = json.loads(data)
    assert doc["type"] == type(ev).__struct_config__.tag and doc["v"] == 1 and doc["at"] == 1.0
    assert decode_admin(data) == ev


@pytest.mark.parametrize(
    ("data", "reason", "detail"),
    [
        (b"{", "bad_json", "truncated"),
        (b'{"type":"worker_exploded","at":1}', "unknown_type", "'worker_exploded'"),
        (b'{"type":"worker_left","v":2,"at":1}', "unsupported_version", "version 2"),
        (b'{"type":"worker_left","at":1,"nope":1}', "schema", "unknown field `nope`"),
        (b'{"type":"operator_action","at":1,"dataset":"d","action":"delete"}', "schema", "$.action"),
        (
            b'{"type":"committed","at":1,"dataset":"d","files":-1,"bytes":0,"duration_s":0}',
            "schema",
            "$.files",
        ),
    ],
)
def test_admin_rejections(data: bytes, reason: str, detail: str) -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_admin(data)
    assert info.value.reason == reason and detail in info.value.detail


def test_job_timed_out_carries_its_shard_and_reads_older_events_without_one() -> None:
    ev = decode_admin(b'{"type":"job_timed_out","v":1,"at":1,"job":"j1","datasets":["sales"],"shard":33}')
    assert isinstance(ev, JobTimedOut) and ev.shard == 33
    older = decode_admin(b'{"type":"job_timed_out","v":1,"at":1,"job":"j1","datasets":["sales"]}')
    assert isinstance(older, JobTimedOut) and older.shard is None
    with pytest.raises(InvalidMessage, match="shard"):
        decode_admin(b'{"type":"job_timed_out","at":1,"job":"j1","shard":-1}')


def test_admin_common_fields_have_defaults() -> None:
    doc: dict[str, Any] = {"type": "worker_left", "at": 5.0}
    ev = decode_admin(json.dumps(doc).encode())
    assert ev == WorkerLeft(at=5.0) and ev.worker == "" and ev.v == 1
