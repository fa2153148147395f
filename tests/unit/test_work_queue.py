"""workers._core._work_queue: one at a time per dataset in the order scheduled, jobs taking turns."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from hypothesis import given, settings
from hypothesis import strategies as st

from workers._core import WorkQueue

_seq = count()


@dataclass(frozen=True)
class Item:
    turn: str
    dataset: str
    n: int = field(default_factory=lambda: next(_seq))


def test_jobs_take_turns_and_a_late_job_waits_for_one_item_of_each_other() -> None:
    q: WorkQueue[Item] = WorkQueue()
    big = [Item("big", f"d{i}") for i in range(100)]
    for it in big:
        assert q.add(it)
    assert q.take() is big[0]
    small = Item("small", "s")
    q.add(small)
    assert q.take() is big[1]
    assert q.take() is small  # not after the 98 other items of "big"
    assert q.take() is big[2]
    assert len(q) == 97


def test_a_dataset_runs_one_item_at_a_time_in_the_order_scheduled() -> None:
    q: WorkQueue[Item] = WorkQueue()
    first, second, third = Item("a", "d"), Item("b", "d"), Item("a", "d")
    other = Item("c", "e")
    assert q.add(first)
    assert not q.add(second)  # behind ``first``
    assert not q.add(third)
    assert q.add(other)
    assert len(q) == 4 and q.datasets == 2
    assert q.take() is first
    assert q.take() is other  # ``second`` is not ready while ``first`` runs
    assert q.take() is None and not q.ready
    assert q.done("d") is second
    assert q.take() is second
    assert q.done("e") is None
    assert q.done("d") is third
    assert q.busy("d") and not q.busy("e")
    assert q.take() is third
    assert q.done("d") is None
    assert len(q) == 0 and q.datasets == 0 and not q.busy("d")


# An operation: add an item (job index, dataset index), take, or end a running item.
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 5)),
        st.tuples(st.just("take"), st.just(0), st.just(0)),
        st.tuples(st.just("done"), st.integers(0, 50), st.just(0)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_every_sequence_keeps_the_rules(ops: list[tuple[str, int, int]]) -> None:
    """Against a model: each item taken once, never two of a dataset out at once, a dataset's items
    in the order added, the queue's length and datasets exact, and a job with items ready is served
    before any other job is served twice."""
    q: WorkQueue[Item] = WorkQueue()
    added: dict[str, list[Item]] = {}  # dataset -> items added, in order
    taken: list[Item] = []
    running: dict[str, Item] = {}
    served_since: dict[str, Passed] = {}
    for op, a, b in ops:
        if op == "add":
            it = Item(f"j{a}", f"d{b}")
            q.add(it)
            added.setdefault(it.dataset, []).append(it)
        elif op == "take":
            it_or_none = q.take()
            if it_or_none is None:
                assert not q.ready
                continue
            it = it_or_none
            assert it.dataset not in running, "two items of one dataset out at once"
            running[it.dataset] = it
            taken.append(it)
            # Every other job that was waiting has now seen one more item served.
            for job, c in served_since.items():
                if job != it.turn:
                    c.n += 1
                    assert c.n <= 3, f"{job} passed over {c.n} times by jobs with items behind it"
            served_since.pop(it.turn, None)
        else:
            if not running:
                continue
            ds = sorted(running)[a % len(running)]
            del running[ds]
            q.done(ds)
        # Jobs with an item ready now, and how often they were passed over since.
        ready_jobs = {it.turn for it in _ready(added, taken, running)}
        served_since = {j: served_since.get(j, Passed()) for j in ready_jobs}
        assert q.ready == bool(ready_jobs)
        not_started = sum(len(v) for v in added.values()) - len(taken)
        assert len(q) == not_started
        assert q.datasets == len({d for d, v in added.items() if v} - _finished(added, taken, running))
    for ds, items in added.items():
        assert [it for it in taken if it.dataset == ds] == items[: len([t for t in taken if t.dataset == ds])]


@dataclass
class Passed:
    n: int = 0


def _ready(added: dict[str, list[Item]], taken: list[Item], running: dict[str, Item]) -> list[Item]:
    """The model: a dataset's next item is ready when none of its items is running."""
    out = []
    done = set(map(id, taken))
    for ds, items in added.items():
        if ds in running:
            continue
        rest = [it for it in items if id(it) not in done]
        if rest:
            out.append(rest[0])
    return out


def _finished(added: dict[str, list[Item]], taken: list[Item], running: dict[str, Item]) -> set[str]:
    """Datasets every item of which was taken and ended."""
    done = set(map(id, taken))
    return {ds for ds, items in added.items() if ds not in running and all(id(it) in done for it in items)}
