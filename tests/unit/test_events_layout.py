"""The storage layout helpers: exact keys, and no key ever leaves its area."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shared.events import (
    DEFAULT_DATASET_PATTERN,
    JOB_PATTERN,
    InvalidMessage,
    StagedKey,
    check_rel_path,
    commits_prefix,
    lock_name,
    manifest_key,
    parse_staged_key,
    published_key,
    staged_key,
    staging_prefix,
    wal_key,
    wal_prefix,
    watermarks_key,
)
from shared.locks import lock_key
from shared.storage import check_key


def test_exact_keys() -> None:
    assert staging_prefix("j1", "sales") == "_staging/j1/sales/"
    assert staging_prefix("j1", "sales", 3, 0) == "_staging/j1/sales/3-0/"
    assert staged_key("j1", "sales", 3, 0, "date=2024-01-01/p.parquet") == (
        "_staging/j1/sales/3-0/date=2024-01-01/p.parquet"
    )
    assert published_key("sales", "j1", 3, "date=2024-01-01/hour=05/p.parquet") == (
        "sales/date=2024-01-01/hour=05/j1~00003-p.parquet"
    )
    assert published_key("sales", "j1", 123456, "p.parquet") == "sales/j1~123456-p.parquet"
    assert manifest_key("sales", "j1") == "sales/_commits/j1.json"
    assert commits_prefix("sales") == "sales/_commits/"
    assert wal_key("sales", "j1") == "_wal/sales/j1.json"
    assert wal_prefix() == "_wal/" and wal_prefix("sales") == "_wal/sales/"
    assert watermarks_key("sales") == "_state/sales/watermarks.json"
    assert lock_name("sales") == "sales"
    assert lock_key(lock_name("sales")) == "_locks/sales.json"
    assert lock_key("_coordinator") == "_locks/_coordinator.json"


def test_staging_prefix_needs_both_or_neither() -> None:
    with pytest.raises(TypeError):
        staging_prefix("j1", "sales", 3)
    with pytest.raises(InvalidMessage, match="task must be >= 0"):
        staging_prefix("j1", "sales", -1, 0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: staging_prefix("../x", "sales"),
        lambda: staging_prefix("j1", "_wal"),
        lambda: published_key("sales", "j1", 0, "../../x"),
        lambda: published_key("a/b", "j1", 0, "x"),
        lambda: published_key("sales", "j1", -1, "x"),
        lambda: manifest_key("sales", "j/1"),
        lambda: wal_key("..", "j1"),
        lambda: watermarks_key(""),
        lambda: lock_name("_coordinator"),
    ],
)
def test_helpers_refuse_bad_names(call: object) -> None:
    with pytest.raises(InvalidMessage):
        call()  # type: ignore[operator]


def test_parse_staged_key_inverts_staged_key() -> None:
    key = staged_key("j1", "sales", 12, 3, "date=x/p.parquet")
    assert parse_staged_key(key) == StagedKey("j1", "sales", 12, 3, "date=x/p.parquet")
    for bad in [
        "_staging/j1/sales/3-0",
        "_staging/j1/sales/x-0/p",
        "_staging/j1/sales/03-0/p",
        "sales/j1/a/0-0/p",
    ]:
        with pytest.raises(InvalidMessage):
            parse_staged_key(bad)


# -- properties ------------------------------------------------------------------------------------

jobs = st.from_regex(JOB_PATTERN, fullmatch=True)
datasets = st.from_regex(DEFAULT_DATASET_PATTERN, fullmatch=True)
tasks = st.integers(min_value=0, max_value=2**31 - 1)
segment_chars = st.characters(codec="utf-8", exclude_characters="/")
hostile_segments = st.sampled_from(["", ".", "..", "_commits", "_x", "a\\b", "\x00", "\n", "/"]) | st.text(
    segment_chars, min_size=1, max_size=12
)
paths = st.lists(hostile_segments, min_size=1, max_size=5).map("/".join) | st.text(max_size=30)
clean_segments = st.text(
    st.characters(codec="utf-8", exclude_characters="/\\", exclude_categories=["Cc"]),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in (".", ".."))


@settings(max_examples=400, deadline=None)
@given(dataset=datasets, job=jobs, task=tasks, rel=paths)
def test_published_key_never_leaves_the_dataset_folder(dataset: str, job: str, task: int, rel: str) -> None:
    try:
        key = published_key(dataset, job, task, rel)
    except InvalidMessage as exc:
        rejected: InvalidMessage | None = exc
    else:
        rejected = None
    if rejected is not None:
        assert rejected.reason == "unsafe_path"
        return
    check_key(key)  # the storage port's own safety check agrees
    parts = key.split("/")
    assert parts[0] == dataset
    assert not any(p in ("", ".", "..") for p in parts)
    assert not key.startswith(commits_prefix(dataset))
    assert parts[-1] == f"{job}~{task:05d}-{rel.split('/')[-1]}"
    assert parts[1:-1] == rel.split("/")[:-1]  # partition folders are kept as they are
    assert len(key.encode()) <= 1024 and len(parts[-1].encode()) <= 255


@settings(max_examples=300, deadline=None)
@given(job=jobs, dataset=datasets, task=tasks, attempt=tasks, rel=paths)
def test_staged_key_stays_in_its_attempt_folder(
    job: str, dataset: str, task: int, attempt: int, rel: str
) -> None:
    try:
        key = staged_key(job, dataset, task, attempt, rel)
    except InvalidMessage:
        return
    check_key(key)
    assert key.startswith(staging_prefix(job, dataset, task, attempt))
    assert parse_staged_key(key) == StagedKey(job, dataset, task, attempt, rel)


@settings(max_examples=300, deadline=None)
@given(
    dataset=datasets,
    job=jobs,
    a=st.tuples(tasks, st.lists(clean_segments, min_size=1, max_size=3)),
    b=st.tuples(tasks, st.lists(clean_segments, min_size=1, max_size=3)),
)
def test_tasks_of_one_job_never_collide(
    dataset: str, job: str, a: tuple[int, list[str]], b: tuple[int, list[str]]
) -> None:
    assume(a != b)
    try:
        ka = published_key(dataset, job, a[0], "/".join(a[1]))
        kb = published_key(dataset, job, b[0], "/".join(b[1]))
    except InvalidMessage:
        return
    assert ka != kb


def test_jobs_whose_ids_extend_each_other_do_not_collide() -> None:
    # With '-' as the separator these two were the same key ('etl-00001-00002-x'):
    # a producer could have overwritten another job's published file.
    assert published_key("d", "etl", 1, "00002-x") != published_key("d", "etl-00001", 2, "x")


@settings(max_examples=500, deadline=None)
@given(
    a=st.tuples(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True), st.integers(0, 10**6)),
    b=st.tuples(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True), st.integers(0, 10**6)),
    name_a=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True),
    name_b=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True),
)
def test_published_names_are_injective(
    a: tuple[str, int], b: tuple[str, int], name_a: str, name_b: str
) -> None:
    assume((a, name_a) != (b, name_b))
    assert published_key("d", a[0], a[1], name_a) != published_key("d", b[0], b[1], name_b)


@settings(max_examples=300, deadline=None)
@given(rel=st.lists(clean_segments, min_size=1, max_size=4))
def test_clean_relative_paths_are_accepted(rel: list[str]) -> None:
    assume(not (len(rel) > 1 and rel[0].startswith("_")))
    assume(all(len(s.encode()) <= 255 for s in rel))
    assert check_rel_path("/".join(rel)) == rel


@settings(max_examples=500, deadline=None)
@given(
    path=st.lists(
        st.sampled_from(["", ".", "..", "_a", "a", ".a", "..a", "a.", "\\", "\x01", "\x7f", "=", "é"])
        | st.text(st.characters(codec="ascii"), max_size=4),
        min_size=1,
        max_size=4,
    ).map("/".join)
)
def test_fast_path_check_agrees_with_check_rel_path(path: str) -> None:
    from shared.events._validation import _basename_and_size

    def verdict(fn: Any) -> str | tuple[int, int]:
        try:
            return fn(path)  # type: ignore[no-any-return]
        except InvalidMessage as exc:
            return exc.reason

    def slow(p: str) -> tuple[int, int]:
        return len(check_rel_path(p)[-1].encode()), len(p.encode())

    assert verdict(_basename_and_size) == verdict(slow)
