"""Example events of every kind, valid ones, for the event codec and schema tests."""

from __future__ import annotations

import json
from typing import Any

from shared.events import (
    Aborted,
    AdminEvent,
    CommitStarted,
    Committed,
    DatasetExpectation,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    JobTimedOut,
    LockTakenOver,
    MessageRejected,
    OperatorAction,
    Quarantined,
    QueueEvent,
    RecoveryDone,
    ShardsAssigned,
    ShardSetAside,
    StagedFile,
    StreamBatch,
    StreamReset,
    TaskFinished,
    WorkerJoined,
    WorkerLeft,
    encode_event,
)


def task_finished(**overrides: Any) -> TaskFinished:
    """Return a TaskFinished with two staged files and watermarks, ``overrides`` replacing fields."""
    fields: dict[str, Any] = {
        "job": "job-2024.01.01_a",
        "dataset": "sales",
        "task": 7,
        "attempt": 1,
        "files": [
            StagedFile(path="date=2024-01-01/part-00007-1b2c.snappy.parquet", size=123456, md5="a" * 32),
            StagedFile(path="date=2024-01-02/part-00007-1b2c.snappy.parquet", size=0),
        ],
        "watermarks": {"kafka:orders:0": 1234567, "kafka:orders:1": 99},
        "finished_at": 1717171717.25,
    }
    fields.update(overrides)
    return TaskFinished(**fields)


EXAMPLES: list[QueueEvent] = [
    JobStarted(job="j1", datasets=["sales", "refunds"], timeout_s=3600, started_at=1717171700.5, app="etl"),
    task_finished(),
    task_finished(files=[], watermarks={}),
    JobFinished(
        job="j1",
        datasets={
            "sales": DatasetExpectation(tasks=3, winners=[0, 2, 0]),
            "refunds": DatasetExpectation(tasks=0),
        },
        finished_at=1717171800.0,
    ),
    JobFailed(job="j1", datasets=["sales"], reason="stage 3 failed: OOM", failed_at=1717171800.0),
    JobCancelled(job="j1", datasets=["sales", "refunds"], reason="user", cancelled_at=1.0),
    JobStarted(
        job="ingest-b7-0a1b2c3d",
        datasets=["events"],
        timeout_s=300,
        started_at=1717171700.5,
        stream=StreamBatch(app_id="ingest", batch=7, query="5b0c1f3e-2a4d-4c8e-9f10-1a2b3c4d5e6f"),
    ),
]


def raw(ev: QueueEvent) -> dict[str, Any]:
    """Return the wire form of ``ev`` as a JSON object."""
    out: dict[str, Any] = json.loads(encode_event(ev))
    return out


ADMIN_EXAMPLES: list[AdminEvent] = [
    WorkerJoined(at=1.0, worker="w1", host="h", pid=42),
    WorkerLeft(at=1.0, worker="w1", reason="shutdown"),
    ShardsAssigned(at=1.0, worker="coord-1", epoch=7, assignment={"w1": [0, 2], "w2": [1]}, moved=1),
    CommitStarted(at=1.0, worker="w1", dataset="sales", job="j1", files=3, bytes=300, epoch=4),
    Committed(at=1.0, worker="w1", dataset="sales", job="j1", files=3, bytes=300, duration_s=0.25, epoch=4),
    Aborted(at=1.0, worker="w1", dataset="sales", job="j1", reason="job_failed", files_deleted=5),
    Quarantined(at=1.0, worker="w1", dataset="sales", job="j1", reason="copy kept failing", attempts=8),
    LockTakenOver(at=1.0, worker="w2", dataset="sales", previous_owner="w1", epoch=5),
    RecoveryDone(at=1.0, worker="w2", dataset="sales", job="j1", steps_redone=2, duration_s=0.1),
    MessageRejected(at=1.0, worker="w1", shard=3, reason="unsafe_path", detail="..", stream_id="1-0"),
    JobTimedOut(at=1.0, worker="w1", job="j1", datasets=["sales"], timeout_s=60, shard=33),
    OperatorAction(at=1.0, dataset="sales", job="j1", action="skip", operator="alice"),
    ShardSetAside(at=1.0, worker="w1", shard=5, key="cf:prod:{s5}:state:jobs", field="j1", reason="v2"),
    StreamReset(at=1.0, app_id="ingest", datasets={"events": 7}, operator="alice"),
]
