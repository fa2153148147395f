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
