"""The one-match check of a message's paths never accepts what the path-by-path check refuses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events import InvalidMessage, StagedFile, TaskFinished, ValidationLimits, validate_event
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


def _exact_bounds(job: str, dataset: str, task: int, attempt: int) -> tuple[int, int]:
    """Return (name prefix, room) for these exact task and attempt numbers (docs/contract.md)."""
    task_digits = len(str(task))
    staged = len("_staging") + 5 + len(job) + len(dataset) + task_digits + len(str(attempt))
    name_prefix = len(job) + max(task_digits, 5) + 2
    return name_prefix, 1024 - max(staged, len(dataset) + 1 + name_prefix)


def _exact_verdict(ev: TaskFinished) -> bool:
    """The path-by-path check with the exact bounds of ``ev`` (its own task and attempt numbers)."""
    try:
        _check_paths(ev, *_exact_bounds(ev.job, ev.dataset, ev.task, ev.attempt))
    except InvalidMessage:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(
    job_len=st.integers(1, 128),
    dataset_len=st.integers(1, 128),
    task=st.sampled_from([0, 7, 99_999, 100_000, 2**31 - 1]),
    attempt=st.sampled_from([0, 3, 2**31 - 1]),
    bound=st.sampled_from(["key", "name"]),
    slack=st.integers(-30, 3),
    others=st.integers(0, 2),
)
def test_around_the_length_limits_validation_agrees_with_the_exact_bounds(
    job_len: int, dataset_len: int, task: int, attempt: int, bound: str, slack: int, others: int
) -> None:
    # One path `slack` bytes from a length bound (the whole key, or the published
    # file name): the quick check with the widest task and attempt numbers must
    # never decide otherwise than the exact bounds.
    job, dataset = "j" * job_len, "d" * dataset_len
    name_prefix, room = _exact_bounds(job, dataset, task, attempt)
    if bound == "key":
        folders = "/".join(["f" * 200] * 4) + "/"
        path = folders + "p" * max(room + slack - len(folders), 1)
    else:
        path = "p" * max(255 - name_prefix + slack, 1)
    files = [StagedFile(path=path, size=1)] + [StagedFile(path=f"o{i}", size=1) for i in range(others)]
    ev = TaskFinished(
        job=job, dataset=dataset, task=task, attempt=attempt, files=files, watermarks={}, finished_at=0.0
    )
    if _exact_verdict(ev):
        assert validate_event(ev, ValidationLimits()) is ev
    else:
        with pytest.raises(InvalidMessage) as caught:
            validate_event(ev, ValidationLimits())
        assert caught.value.reason == "unsafe_path"
