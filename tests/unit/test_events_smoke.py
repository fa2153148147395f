"""First round-trip check of the message contract (the full suite is in test_events_*.py)."""

from __future__ import annotations

from shared.events import (
    StagedFile,
    TaskFinished,
    ValidationLimits,
    decode_event,
    encode_event,
)


def test_task_finished_round_trip() -> None:
    ev = TaskFinished(
        job="j1",
        dataset="sales",
        task=3,
        attempt=1,
        files=[StagedFile(path="date=2024-01-01/part-0.parquet", size=10)],
        finished_at=1.5,
    )
    assert decode_event(encode_event(ev), sig=None, limits=ValidationLimits()) == ev
