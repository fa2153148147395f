"""A small bounded, thread-safe memory of what a process last saw, by store and key.

Used for guesses that save a read (the lock object's last state, a dataset's
watermarks document): a wrong guess costs one refused conditional write, then
the usual read, so nothing here is ever taken as a fact.

Memory follows the bound, not the history (issue 9): entries are kept per
store URL (no tuple key per entry), in a plain dict whose insertion order is
the recency order, and the oldest are forgotten first. Callers store compact
values (interned repeated strings, tuples rather than dicts).
"""

from __future__ import annotations

import threading
from typing import Final, Generic, TypeVar

V = TypeVar("V")

# How many datasets a process remembers for its guesses (lock state, watermarks,
# validated names, routing). A guess pays off for datasets that come back often
# (a streaming pipeline committing the same datasets every few minutes), and a
# worker handles few of those; a dataset seen once a day costs one extra read
# on a miss, nothing next to a day. So the bound follows the open work (32
# commits at a time by default, times a margin), not the catalogue of datasets:
# 4,096 entries held 5 MB a worker in the soak (issue 9), 1,024 about 1.3 MB.
GUESS_LIMIT: Final = 1024


class Recent(Generic[V]):
    """At most ``limit`` values by (store URL, key), least recently put forgotten first."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._limit = limit
        self._size = 0
        self._mutex = threading.Lock()  # commits and contenders may run on several threads' loops
        self._by_url: dict[str, dict[str, V]] = {}

    def __len__(self) -> int:
        with self._mutex:
            return self._size

    def get(self, url: str, key: str) -> V | None:
        """Return the value last put for ``key`` in the store at ``url``, or None."""
        with self._mutex:
            table = self._by_url.get(url)
            return None if table is None else table.get(key)

    def put(self, url: str, key: str, value: V) -> None:
        """Remember ``value`` as the latest for ``key``; forget the oldest entries past the bound."""
        with self._mutex:
            table = self._by_url.get(url)
            if table is None:
                table = self._by_url[url] = {}
            if key in table:
                del table[key]  # re-inserted below: now the most recent
            else:
                self._size += 1
            table[key] = value
            while self._size > self._limit:
                self._evict_one()

    def forget(self, url: str, key: str) -> None:
        """Forget ``key`` (its state is unknown)."""
        with self._mutex:
            table = self._by_url.get(url)
            if table is not None and key in table:
                del table[key]
                self._size -= 1
                if not table:
                    del self._by_url[url]

    def _evict_one(self) -> None:
        # One store per process is the common case; with several, the biggest
        # table gives up its oldest entry (recency across stores is not kept).
        url = max(self._by_url, key=lambda u: len(self._by_url[u]))
        table = self._by_url[url]
        del table[next(iter(table))]
        self._size -= 1
        if not table:
            del self._by_url[url]


__all__ = ["GUESS_LIMIT", "Recent"]
