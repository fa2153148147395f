"""Operator access to the streaming apps' records: find them in the store, and reset one app's.

The records live in each dataset's watermarks document (see
:mod:`._stream_gate`). ``commitfleet stream show`` lists an app's; ``commitfleet
stream reset`` removes them, so that a query whose batch ids began again (a
deleted checkpoint) may commit under the same app id: an explicit operator
action, audited by the CLI on the admin stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ..events import state_prefix
from ..storage import ObjectStore
from ._model import StreamRecord
from ._watermarks import Streams, read_watermarks_doc, swap_watermarks

_SUFFIX = "/watermarks.json"


async def list_stream_datasets(store: ObjectStore) -> list[str]:
    """Return every dataset that has a watermarks document, sorted.

    Raises:
        TransientError: from the store.
    """
    found: list[str] = []
    async for info in store.list(state_prefix()):
        parts = info.key.split("/")
        if len(parts) == 3 and info.key.endswith(_SUFFIX):
            found.append(parts[1])
    return sorted(found)


async def read_stream_records(
    store: ObjectStore, app_id: str, datasets: Iterable[str] | None = None
) -> dict[str, StreamRecord]:
    """Return ``app_id``'s record per dataset (of ``datasets``, or of every dataset in the store).

    Raises:
        CommitStepFailed: a watermarks document is unreadable.
        TransientError: from the store.
    """
    names = list(datasets) if datasets is not None else await list_stream_datasets(store)
    found: dict[str, StreamRecord] = {}
    for name in names:
        doc = await read_watermarks_doc(store, name)
        if doc is not None and app_id in doc.streams:
            found[name] = doc.streams[app_id]
    return found


async def reset_stream(
    store: ObjectStore, dataset: str, app_id: str, *, clock: Callable[[], float] = time.time
) -> StreamRecord | None:
    """Remove ``app_id``'s record from the dataset's watermarks document (compare-and-swap).

    The watermark values and other apps' records are kept. Meant for a
    stopped query: a commit of the app racing the reset may record its batch
    again (the compare-and-swap keeps the document whole either way).

    Returns:
        The record removed, or None when there was none.

    Raises:
        CommitStepFailed: the document is unreadable.
        TransientError: from the store, or too many lost races.
    """
    removed: list[StreamRecord] = []

    def change(doc: tuple[dict[str, int], Streams]) -> tuple[dict[str, int], Streams]:
        values, streams = doc
        removed.clear()
        if app_id not in streams:
            return doc
        rest = dict(streams)
        removed.append(rest.pop(app_id))
        return values, rest

    await swap_watermarks(store, dataset, change, clock, lambda: None)
    return removed[0] if removed else None


__all__ = ["list_stream_datasets", "read_stream_records", "reset_stream"]
