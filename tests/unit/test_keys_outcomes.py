"""The admin outcome keys live in the admin stream's Redis Cluster slot (one script touches all three)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from shared.queue import Keys

fleets = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
datasets = st.text(min_size=1, max_size=128).filter(lambda d: "/" not in d)
jobs = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}", fullmatch=True)


@given(fleets, datasets, jobs)
def test_marker_and_counts_share_the_admin_stream_slot(fleet: str, dataset: str, job: str) -> None:
    keys = Keys(fleet)
    slot = key_slot(keys.admin.encode())
    assert key_slot(keys.outcome_marker(dataset, job).encode()) == slot
    assert key_slot(keys.outcome_counts.encode()) == slot
    assert keys.outcome_marker(dataset, job).startswith(keys.prefix + ":")


@pytest.mark.parametrize(("dataset", "job"), [("a/b", "j"), ("", "j"), ("d", "")])
def test_bad_marker_names_are_refused(dataset: str, job: str) -> None:
    with pytest.raises(ValueError, match="bad outcome marker"):
        Keys("prod").outcome_marker(dataset, job)
