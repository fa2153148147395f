"""Dataset names chosen by the shard they live on (the product's ``shard_of`` routing)."""

from __future__ import annotations

import itertools

from shared.queue import shard_of


def datasets_on(shard: int, shards: int, n: int, *, prefix: str = "ds", width: int = 0) -> list[str]:
    """Return the first ``n`` names ``{prefix}{i}`` (i = 0, 1, ...; zero-padded to ``width``) on ``shard``.

    Raises ValueError when ``shard`` is not one of ``range(shards)`` (no name
    would ever be found).
    """
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not one of {shards}")
    names = (f"{prefix}{i:0{width}d}" for i in itertools.count())
    return list(itertools.islice((name for name in names if shard_of(name, shards) == shard), n))


def dataset_on(shard: int, shards: int, prefix: str = "ds") -> str:
    """Return the first name ``{prefix}{i}`` that lives on ``shard`` (of ``shards``)."""
    return datasets_on(shard, shards, 1, prefix=prefix)[0]
