"""Shard routing: which shard holds a dataset (pure functions, no I/O).

The rule, which every producer in any language must follow exactly::

    h     = SHA-256(UTF-8 bytes of the dataset name)
    shard = (first 8 bytes of h read as an unsigned big-endian 64-bit integer) mod N

N is the fleet's shard count, fixed when the fleet is created. Python's
built-in ``hash`` is salted per process and must never be used for this.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from ..events import QueueEvent, event_datasets, restrict_to


def shard_of(dataset: str, shards: int) -> int:
    """Return the shard (``0 <= shard < shards``) that holds ``dataset``.

    Stable across processes, hosts, Python versions and languages (see the
    module docstring for the exact rule).

    Raises:
        ValueError: ``shards`` is not positive.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    digest = hashlib.sha256(dataset.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def group_by_shard(datasets: Iterable[str], shards: int) -> dict[int, list[str]]:
    """Return the datasets grouped by shard, each group in first-seen order, duplicates dropped.

    Raises:
        ValueError: ``shards`` is not positive.
    """
    groups: dict[int, list[str]] = {}
    seen: set[str] = set()
    for name in datasets:
        if name in seen:
            continue
        seen.add(name)
        groups.setdefault(shard_of(name, shards), []).append(name)
    return groups


def split_by_shard(ev: QueueEvent, shards: int) -> dict[int, QueueEvent]:
    """Return the copies of ``ev`` to publish, keyed by shard.

    A job-level event goes to every shard that holds one of its datasets,
    each copy carrying only that shard's datasets (order kept); a
    ``TaskFinished`` goes to its dataset's shard unchanged. An event with
    no dataset maps to no shard (an empty dict).

    Raises:
        ValueError: ``shards`` is not positive.
    """
    groups = group_by_shard(event_datasets(ev), shards)
    if len(groups) == 1:
        return {shard: ev for shard in groups}
    return {shard: restrict_to(ev, set(names)) for shard, names in groups.items()}


__all__ = ["group_by_shard", "shard_of", "split_by_shard"]
