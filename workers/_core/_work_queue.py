"""A shard's work not started yet: taken in turn across jobs, one at a time per dataset.

Pure (no I/O, no awaits): :class:`workers._scheduler.Scheduler` adds
work as intake decides it and takes the next piece whenever a worker-wide
in-flight slot is free.

Two rules decide what runs next:

- **One at a time per dataset, in the order scheduled.** A piece of work whose
  dataset already has one queued or running waits behind it, and takes no
  slot meanwhile; when that one ends, the next of its dataset becomes ready.
- **Jobs take turns.** Ready work is kept per job (recoveries, which belong to
  no job, share one turn), and each take serves the next job in turn. A job
  whose event named 10,000 datasets (a ``job_failed``, or a ``job_finished``
  of a big job) no longer holds back the commit of a job that finished a
  second later on the same shard: that commit runs after at most one piece of
  work of each other job with work ready.

The queue holds at most one piece of work per work key (the caller checks),
each about a dataset of the shard's open work or an unfinished commit in the
store: it is as large as the open work, and the caller pauses intake while it
is longer than ``worker.max_queued_work``.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    """What the queue needs of an item: its dataset and the job whose turn it takes."""

    @property
    def dataset(self) -> str: ...

    @property
    def turn(self) -> str: ...


Q = TypeVar("Q", bound=Queued)


class WorkQueue(Generic[Q]):
    """Items not started yet; :meth:`take` gives the next in turn, :meth:`done` frees its dataset."""

    __slots__ = ("_behind", "_busy", "_ready", "_size")

    def __init__(self) -> None:
        # turn (job) -> its ready items, oldest first; dict order is the turn order.
        self._ready: dict[str, deque[Q]] = {}
        # dataset -> items behind the one of that dataset that is ready or running.
        self._behind: dict[str, deque[Q]] = {}
        # Datasets with an item ready or running (each has exactly one).
        self._busy: set[str] = set()
        self._size = 0  # items ready or behind (not started)

    def __len__(self) -> int:
        """Return how many items are queued and not started (ready or behind another)."""
        return self._size

    @property
    def ready(self) -> bool:
        """Whether :meth:`take` has an item to give."""
        return bool(self._ready)

    @property
    def datasets(self) -> int:
        """Return how many datasets have an item queued or running (0: the queue holds nothing)."""
        return len(self._busy)

    def busy(self, dataset: str) -> bool:
        """Return whether ``dataset`` has an item ready or running."""
        return dataset in self._busy

    def add(self, item: Q) -> bool:
        """Queue ``item``; return True when it is ready, False when it waits behind its dataset's."""
        self._size += 1
        dataset = item.dataset
        if dataset in self._busy:
            self._behind.setdefault(dataset, deque()).append(item)
            return False
        self._busy.add(dataset)
        self._make_ready(item)
        return True

    def take(self) -> Q | None:
        """Return the next ready item (the oldest of the next job in turn), or None.

        The item counts as running until :meth:`done` is called for its dataset.
        """
        if not self._ready:
            return None
        turn = next(iter(self._ready))
        items = self._ready.pop(turn)
        item = items.popleft()
        if items:
            self._ready[turn] = items  # to the back of the turns
        self._size -= 1
        return item

    def done(self, dataset: str) -> Q | None:
        """Mark the running item of ``dataset`` ended; return the item of that dataset made ready, if any."""
        behind = self._behind.get(dataset)
        if not behind:
            self._busy.discard(dataset)
            return None
        item = behind.popleft()
        if not behind:
            del self._behind[dataset]
        self._make_ready(item)
        return item

    def clear(self) -> list[Q]:
        """Empty the queue; return the items not started (ready or behind). Call it when none runs."""
        left = [item for items in self._ready.values() for item in items]
        left += [item for items in self._behind.values() for item in items]
        self._ready.clear()
        self._behind.clear()
        self._busy.clear()
        self._size = 0
        return left

    def _make_ready(self, item: Q) -> None:
        items = self._ready.get(item.turn)
        if items is None:
            self._ready[item.turn] = deque((item,))
        else:
            items.append(item)


__all__ = ["Queued", "WorkQueue"]
