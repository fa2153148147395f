"""The one-match check of a message's paths never accepts what the path-by-path check refuses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events import InvalidMessage, StagedFile, TaskFinished
from shared.events._validation import _all_plain, _check_paths

# Characters around every rule: separators, dots, the '_' folder rule, the
# joining "\n", other control characters, backslash, non-ASCII and C1 controls.
_ALPHABET = ["a", "b", ".", "..", "_", "/", "\n", "\r", "\\", "\x00", "\x7f", "\x85", "é", "-", " "]
paths = st.lists(st.sampled_from(_ALPHABET), min_size=0, max_size=8).map("".join)


def _event(files: list[str]) -> TaskFinished:
    return TaskFinished(
        job="j",
        dataset="d",
        task=0,
        attempt=0,
        files=[StagedFile(path=p, size=1) for p in files],
        watermarks={},
        finished_at=0.0,
    )


def _slow_accepts(files: list[str], name_prefix: int, room: int) -> bool:
    try:
        _check_paths(_event(files), name_prefix, room)
    except InvalidMessage:
        return False
    return True


@settings(max_examples=800, deadline=None)
@given(
    files=st.lists(paths, min_size=1, max_size=4), name_prefix=st.integers(0, 300), room=st.integers(0, 300)
)
def test_what_the_fast_check_accepts_the_path_by_path_check_accepts(
    files: list[str], name_prefix: int, room: int
) -> None:
    if _all_plain(files, name_prefix, room):
        assert _slow_accepts(files, name_prefix, room)


@pytest.mark.parametrize(
    "files",
    [
        ["part-0.parquet"],
        ["a/b/c.parquet", "a/b/d.parquet", "x=1/part-00001.snappy.parquet"],
        ["a..b", "a/_b", "x=1/y-2"],
    ],
)
def test_ordinary_paths_take_the_fast_check(files: list[str]) -> None:
    assert _slow_accepts(files, 20, 900)
    assert _all_plain(files, 20, 900)


@pytest.mark.parametrize(
    "files",
    [
        ["a", "a"],
        ["..\nb"],
        ["..", "b"],
        ["a/..", "b"],
        ["_x/y"],
        ["a", "_x/y"],
        ["_x\nb/c"],
        ["a\\b"],
        ["é"],
        ["x" * 256],
        ["_SUCCESS"],  # valid, but checked path by path
        [".hidden"],
        ["a b"],
    ],
)
def test_the_fast_check_refuses_what_is_unsafe_or_not_plain(files: list[str]) -> None:
    assert not _all_plain(files, 0, 900)
