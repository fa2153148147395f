"""The admin event type filter that ``commitfleet events --type`` and ``GET /events?type=`` share."""

from __future__ import annotations

import pytest

from coordinator.admin import event_types
from shared import BadInput
from shared.events import ADMIN_EVENT_TYPES


def test_repeated_and_comma_separated_names_are_the_same_filter() -> None:
    assert event_types(["committed", "aborted"]) == {"committed", "aborted"}
    assert event_types(["committed,aborted"]) == {"committed", "aborted"}
    assert event_types([" committed , aborted,", "quarantined"]) == {"committed", "aborted", "quarantined"}


def test_no_name_is_no_filter() -> None:
    assert event_types([]) == set()
    assert event_types([""]) == set()
    assert event_types([",,"]) == set()


def test_every_admin_event_type_is_accepted() -> None:
    assert event_types([",".join(ADMIN_EVENT_TYPES)]) == set(ADMIN_EVENT_TYPES)


@pytest.mark.parametrize("given", [["commited"], ["committed,Committed"], ["committed aborted"]])
def test_an_unknown_name_is_refused_with_the_known_ones(given: list[str]) -> None:
    with pytest.raises(BadInput, match=r"unknown admin event type\(s\) .*; known: .*committed"):
        event_types(given)


def test_a_dataset_filter_matches_the_events_that_list_the_dataset() -> None:
    from coordinator.admin import event_matches
    from shared.events import AdminEvent, JobTimedOut, MessageRejected, Quarantined, StreamReset

    def passes(ev: AdminEvent, **f: str | None) -> bool:
        return event_matches(ev, types=set(), dataset=f.get("dataset"), job=f.get("job"))

    timed_out = JobTimedOut(at=1.0, shard=0, job="j1", timeout_s=5.0, datasets=["a", "b"])
    assert passes(timed_out, dataset="b") and passes(timed_out, dataset="a", job="j1")
    assert not passes(timed_out, dataset="c") and not passes(timed_out, dataset="b", job="j2")
    reset = StreamReset(at=1.0, app_id="app", datasets={"a": 3}, operator="me")
    assert passes(reset, dataset="a") and not passes(reset, dataset="b")
    assert passes(Quarantined(at=1.0, dataset="a", job="j", reason="r"), dataset="a")
    assert not passes(MessageRejected(at=1.0, shard=0, reason="schema"), dataset="a")


@pytest.mark.parametrize(
    ("dataset", "job"),
    [("../x", None), ("a" * 129, None), ("\u00e9t\u00e9", None), (None, "j 1"), (None, "")],
)
def test_names_no_event_can_carry_are_refused(dataset: str | None, job: str | None) -> None:
    from coordinator.admin import filter_names

    with pytest.raises(BadInput):
        filter_names(dataset, job)
    filter_names("ds-1.x=2", "job_1.a-b")
    filter_names(None, None)
