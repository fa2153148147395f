"""A job's attempts are found through an index, never by scanning every open dataset of the shard.

``ShardJobs.attempts_of`` / ``replace_attempts`` / ``end_job`` (and through
them ``attempt_fields``) must see exactly the job's keys of ``attempts``:
checked against the full scan over random histories, and checked not to
iterate over ``attempts`` at all. A failed status change's put back touches
no attempt (a job's attempts go only once its end is saved).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events import DatasetExpectation, StagedFile
from workers._core import Attempt, Ended, ShardJobs
from workers._ledger import _put_back, _records_of
from workers._state_store import attempt_fields

JOBS = ["j0", "j1", "j2"]
DATASETS = ["a", "b", "c"]

_op = st.one_of(
    st.tuples(
        st.just("add"),
        st.sampled_from(JOBS),
        st.sampled_from(DATASETS),
        st.integers(0, 3),
        st.integers(0, 2),
    ),
    st.tuples(st.just("end"), st.sampled_from(JOBS)),
    st.tuples(st.just("put_back_end"), st.sampled_from(JOBS)),
)


def _rec(task: int, attempt: int, seq: int) -> Attempt:
    return Attempt(task=task, attempt=attempt, files=[StagedFile(path="p", size=1)], seq=seq)


def _scanned(state: ShardJobs, job: str) -> dict[tuple[str, str], Any]:
    return {k: v for k, v in state.attempts.items() if k[0] == job}


@settings(max_examples=300, deadline=None)
@given(st.lists(_op, max_size=40))
def test_the_index_matches_a_full_scan(ops: list[tuple[Any, ...]]) -> None:
    state = ShardJobs()
    seq = 0
    for op in ops:
        if op[0] == "add":
            seq += 1
            state.load_attempt(op[1], op[2], _rec(op[3], op[4], seq))
        elif op[0] == "end":
            state.end_job(op[1], "aborted", 1.0)
            assert _scanned(state, op[1]) == {}
        else:  # a status change that would end the job, whose save failed: put back
            before = {k: {t: dict(a) for t, a in v.items()} for k, v in _scanned(state, op[1]).items()}
            records = _records_of(state, op[1])
            state.ended[op[1]] = Ended(status="committed", at=1.0)  # all such a change does before its save
            _put_back(state, op[1], records)
            assert _scanned(state, op[1]) == before
            assert state.ended.get(op[1]) == records[1]
        for job in JOBS:
            assert state.attempts_of(job) == _scanned(state, job)
            fields = {
                f"{job}/{ds}/{t}/{n}"
                for (_j, ds), per in _scanned(state, job).items()
                for t in per
                for n in per[t]
            }
            assert set(attempt_fields(state, job)) == fields


class _NoScan(dict[tuple[str, str], Any]):
    """The attempts of a shard with many open datasets: a full iteration fails the test."""

    def _refuse(self, *args: object) -> Any:
        raise AssertionError("scanned every open dataset of the shard")

    __iter__ = keys = items = values = _refuse  # type: ignore[assignment]


def test_a_job_end_and_a_put_back_look_up_only_the_jobs_datasets() -> None:
    state = ShardJobs()
    for i in range(200):
        state.load_attempt(f"other{i}", "a", _rec(0, 0, i + 1))
    state.load_attempt("j", "a", _rec(0, 0, 500))
    state.load_attempt("j", "b", _rec(0, 0, 501))
    # Datasets waiting for a straggler task: the tally keeps a count for each.
    exp = DatasetExpectation(tasks=2)
    for i in range(200):
        state.tally.count(f"other{i}", "a", exp, state.attempts[(f"other{i}", "a")])
    assert state.tally.count("j", "a", exp, state.attempts[("j", "a")]) == 1
    state.attempts = _NoScan(dict.items(state.attempts))
    state.tally.counts = _NoScan(dict.items(state.tally.counts))

    assert sorted(attempt_fields(state, "j")) == ["j/a/0/0", "j/b/0/0"]
    _put_back(state, "j", _records_of(state, "j"))  # a failed status change: no attempt looked at
    state.end_job("j", "aborted", 2.0)
    assert dict.__len__(state.attempts) == 200
    assert dict.__len__(state.tally.counts) == 200  # the job's count forgotten, the others kept
    assert ("j", "a") not in state.tally.counts
