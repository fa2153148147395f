"""A thread-safe cache of values by key, bounded by their sizes in bytes, least recently used first out.

The table step keeps three kinds of immutable things by location: metadata
files' bytes (:mod:`._table_io`), their parsed metadata (:mod:`._sql_catalog`)
and the records of manifest lists it wrote (:mod:`._iceberg_manifests`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class SizedCache(Generic[V]):
    """Values by key, at most ``max_bytes`` of them in all and ``max_item_bytes`` each. Thread-safe."""

    def __init__(self, max_bytes: int, max_item_bytes: int | None = None) -> None:
        self._max_bytes = max_bytes
        self._max_item = max_bytes if max_item_bytes is None else max_item_bytes
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        """Return the value kept under ``key`` (now the most recently used), or None."""
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            self._items.move_to_end(key)
            return found[0]

    def put(self, key: str, value: V, size: int) -> None:
        """Keep ``value`` (``size`` bytes) under ``key``, dropping the least recently used over the bound.

        A value over the per-item bound is not kept (and one kept before under ``key`` stays).
        """
        if size > self._max_item:
            return
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes += size - (old[1] if old is not None else 0)
            self._items[key] = (value, size)
            while self._bytes > self._max_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def forget(self, key: str) -> None:
        """Drop what is kept under ``key``, if anything."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]


__all__ = ["SizedCache"]
