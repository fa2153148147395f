"""Properties over generated valid events: round trip, schema agreement, restrict_to partitions."""

from __future__ import annotations

import json

import jsonschema  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events import (
    DEFAULT_DATASET_PATTERN,
    JOB_PATTERN,
    DatasetExpectation,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TaskFinished,
    ValidationLimits,
    decode_entry,
    decode_event,
    encode_event,
    entry_fields,
    event_datasets,
    queue_event_schema,
    restrict_to,
)

LIMITS = ValidationLimits(secret=b"k")
SCHEMA = jsonschema.Draft202012Validator(queue_event_schema())

jobs = st.from_regex(JOB_PATTERN, fullmatch=True).filter(lambda j: len(j) <= 40)
names = st.from_regex(DEFAULT_DATASET_PATTERN, fullmatch=True).filter(lambda d: len(d) <= 40)
dataset_lists = st.lists(names, min_size=1, max_size=5, unique=True)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
index = st.integers(min_value=0, max_value=2**31 - 1)
segment = st.text(
    st.characters(codec="utf-8", exclude_characters="/\\", exclude_categories=["Cc"]), min_size=1, max_size=20
).filter(lambda s: s not in (".", ".."))
rel_paths = st.lists(segment, min_size=1, max_size=3).filter(
    lambda p: len(p) == 1 or not p[0].startswith("_")
)
files = st.builds(
    StagedFile,
    path=rel_paths.map("/".join),
    size=st.integers(min_value=0, max_value=2**63 - 1),
    md5=st.none() | st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
)


@st.composite
def expectations(draw: st.DrawFn) -> DatasetExpectation:
    tasks = draw(st.integers(min_value=0, max_value=20))
    winners = draw(st.none() | st.lists(st.integers(0, 5), min_size=tasks, max_size=tasks))
    return DatasetExpectation(tasks=tasks, winners=winners)


events: st.SearchStrategy[QueueEvent] = st.one_of(
    st.builds(
        JobStarted,
        job=jobs,
        datasets=dataset_lists,
        timeout_s=st.floats(min_value=0.001, max_value=1e6),
        started_at=times,
        app=st.text(max_size=20),
    ),
    st.builds(
        TaskFinished,
        job=jobs,
        dataset=names,
        task=index,
        attempt=index,
        files=st.lists(files, max_size=4, unique_by=lambda f: f.path),
        watermarks=st.dictionaries(
            st.text(min_size=1, max_size=10), st.integers(-(2**63), 2**63 - 1), max_size=3
        ),
        finished_at=times,
    ),
    st.builds(
        JobFinished,
        job=jobs,
        datasets=st.dictionaries(names, expectations(), min_size=1, max_size=4),
        finished_at=times,
    ),
    st.builds(JobFailed, job=jobs, datasets=dataset_lists, reason=st.text(max_size=30), failed_at=times),
    st.builds(
        JobCancelled, job=jobs, datasets=dataset_lists, reason=st.text(max_size=30), cancelled_at=times
    ),
)


@settings(max_examples=200, deadline=None)
@given(ev=events)
def test_valid_events_round_trip_signed_and_match_the_schema(ev: QueueEvent) -> None:
    fields = entry_fields(ev, secret=b"k")
    assert decode_entry(fields, limits=LIMITS) == ev
    SCHEMA.validate(json.loads(fields["data"]))


@settings(max_examples=100, deadline=None)
@given(ev=events, shards=st.integers(min_value=1, max_value=4), data=st.data())
def test_restrict_to_partitions_a_job_level_event(ev: QueueEvent, shards: int, data: st.DataObject) -> None:
    names_ = event_datasets(ev)
    owner = {d: data.draw(st.integers(0, shards - 1)) for d in names_}
    pieces = []
    for shard in range(shards):
        mine = {d for d, s in owner.items() if s == shard}
        if not mine:
            continue
        part = restrict_to(ev, mine)
        assert set(event_datasets(part)) == mine
        assert decode_event(encode_event(part), sig=None, limits=ValidationLimits()) == part
        pieces.extend(event_datasets(part))
    assert sorted(pieces) == sorted(names_)
