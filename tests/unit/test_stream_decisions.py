"""The streaming decisions, pure: the driver's plan of a batch, the fleet's gate, the record's merge."""

from __future__ import annotations

import re

import pytest

from shared import BadInput
from shared.commit import StreamMark, StreamRecord, stream_verdict
from shared.commit._watermarks import merge_stream, stream_covered
from shared.events import JOB_PATTERN, StreamBatch
from shared.spark import StreamConflict
from shared.spark._stream_plan import check_app_id, dead_runs, plan_batch, stream_job_id

Q1, Q2 = "query-one", "query-two"


def rec(batch: int, query: str = Q1, job: str = "j") -> StreamRecord:
    return StreamRecord(batch=batch, query=query, job=job)


def test_a_batch_after_every_record_commits_every_dataset() -> None:
    plan = plan_batch("app", Q1, 5, ("a", "b"), {"a": rec(4), "b": rec(3)})
    assert plan.todo == ("a", "b") and plan.done == {} and not plan.skip


def test_a_dataset_at_or_past_the_batch_is_skipped_and_all_of_them_skip_the_batch() -> None:
    plan = plan_batch("app", Q1, 5, ("a", "b", "c"), {"a": rec(5, job="j5"), "b": rec(4), "c": rec(7)})
    assert plan.todo == ("b",) and set(plan.done) == {"a", "c"}
    plan = plan_batch("app", Q1, 5, ("a", "b"), {"a": rec(5), "b": rec(9)})
    assert plan.skip and plan.todo == ()


def test_no_record_commits_and_records_of_other_datasets_do_not_count() -> None:
    assert plan_batch("app", Q1, 0, ("a",), {}).todo == ("a",)
    assert plan_batch("app", Q1, 0, ("a",), {"z": rec(3)}).todo == ("a",)


def test_another_query_at_or_past_the_batch_is_a_conflict_naming_the_app_and_the_way_out() -> None:
    with pytest.raises(StreamConflict) as info:
        plan_batch("ingest", Q2, 0, ("a", "b"), {"a": rec(0, Q1, "ingest-b0-0a0b0c0d"), "b": rec(3, Q1)})
    msg = str(info.value)
    assert "'ingest'" in msg and "commitfleet stream reset ingest" in msg and "new app_id" in msg
    assert set(info.value.records) == {"a", "b"} and isinstance(info.value, BadInput)


def test_another_query_below_the_batch_is_not_a_conflict() -> None:
    plan = plan_batch("app", Q2, 4, ("a",), {"a": rec(3, Q1)})
    assert plan.todo == ("a",)


@pytest.mark.parametrize("app", ["a", "A.b_c-9", "x" * 64])
def test_good_app_ids(app: str) -> None:
    assert check_app_id(app) == app
    job = stream_job_id(app, 2**63 - 1)
    assert re.fullmatch(JOB_PATTERN, job), job


@pytest.mark.parametrize("app", ["", "-a", "_a", ".a", "a/b", "a b", "x" * 65, "a:b", "é"])
def test_bad_app_ids(app: str) -> None:
    with pytest.raises(BadInput, match="app_id"):
        check_app_id(app)


def test_dead_runs_are_this_batchs_jobs_only() -> None:
    keys = [
        "_staging/app-b3-0a1b2c3d/events/0-0/part.parquet",
        "_staging/app-b3-0a1b2c3d/users/1-0/part.parquet",
        "_staging/app-b3-ffffffff/events/0-1/x.parquet",
        "_staging/app-b3-current0/events/0-0/x.parquet",  # not 8 hex
        "_staging/app-b3-x-b1-00000000/events/0-0/x.parquet",  # another app: "app-b3-x"
        "_staging/app-b3-0a1b2c3d",  # not a staged file
    ]
    assert dead_runs(keys, "app", 3) == {
        "app-b3-0a1b2c3d": ["events", "users"],
        "app-b3-ffffffff": ["events"],
    }
    assert dead_runs(keys, "app", 3, current="app-b3-ffffffff") == {"app-b3-0a1b2c3d": ["events", "users"]}


def test_the_gate_refuses_a_covered_batch_of_another_job_only() -> None:
    mark = StreamBatch(app_id="app", batch=5, query=Q1)
    assert stream_verdict({}, mark, "j") is None
    assert stream_verdict({"app": rec(4, job="old")}, mark, "j") is None
    assert stream_verdict({"other": rec(9)}, mark, "j") is None
    assert (
        stream_verdict({"app": rec(5, job="j")}, mark, "j") is None
    )  # its own commit: found by the manifest
    refused = stream_verdict({"app": rec(5, job="old")}, mark, "j")
    assert refused is not None and refused.startswith("stream: ") and "already committed" in refused
    conflict = stream_verdict({"app": rec(9, Q2, job="old")}, mark, "j")
    assert conflict is not None and "commitfleet stream reset app" in conflict


def test_the_record_moves_forward_only() -> None:
    m5 = StreamMark(app_id="app", batch=5, query=Q1, job="j5")
    assert merge_stream({}, m5)["app"].batch == 5
    assert merge_stream({"app": rec(7)}, m5)["app"].batch == 7
    assert merge_stream({"app": rec(4)}, m5)["app"] == StreamRecord(batch=5, query=Q1, job="j5")
    assert merge_stream({"other": rec(1)}, None) == {"other": rec(1)}
    assert stream_covered({"app": rec(5)}, m5) and not stream_covered({"app": rec(4)}, m5)
    assert stream_covered({}, None) and not stream_covered({}, m5)
