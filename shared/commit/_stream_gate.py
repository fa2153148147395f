"""The stream gate: a streaming job's commit of a micro-batch the dataset already holds is refused.

Decided under the dataset's lock, after its older sequences are finished
(a dead run's log of the same batch is rolled forward first) and before this
job's log is created: the dataset's watermarks document records, per streaming
app, the last batch committed and the query that committed it
(docs/streaming.md). :func:`stream_verdict` is the pure decision;
:func:`check_stream` reads the record and applies it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..events import StreamBatch
from ..storage import ObjectStore
from ._model import StreamRecord
from ._watermarks import read_watermarks_doc

REFUSED_PREFIX = "stream: "
"""Every refusal's reason starts with this (the driver re-reads the record when it sees one)."""


def stream_verdict(streams: Mapping[str, StreamRecord], mark: StreamBatch, job: str) -> str | None:
    """Return why ``job``'s commit of ``mark`` must be refused, or None to go on (pure).

    Refused: the app's record is at or past ``mark.batch`` and was written by
    another job (a replay of a committed batch, or a restarted query whose
    batch ids began again). A record of ``job`` itself is its own commit, which
    the pipeline then finds by its manifest.
    """
    rec = streams.get(mark.app_id)
    if rec is None or rec.batch < mark.batch or rec.job == job:
        return None
    if rec.query != mark.query:
        return (
            f"{REFUSED_PREFIX}app {mark.app_id}: batch {mark.batch} of query {mark.query}, but the store "
            f"records batch {rec.batch} of another query {rec.query} (job {rec.job}); a restarted query "
            f"with a new checkpoint needs a new app_id, or `commitfleet stream reset {mark.app_id}`"
        )
    return (
        f"{REFUSED_PREFIX}app {mark.app_id}: batch {mark.batch} is already committed "
        f"(the store records batch {rec.batch}, job {rec.job})"
    )


async def check_stream(store: ObjectStore, dataset: str, mark: StreamBatch, job: str) -> str | None:
    """Read the dataset's stream records and return why the commit is refused, or None.

    The document read is kept as this process's guess for the commit's own
    compare-and-swap of it (so going on costs no second read).

    Raises:
        CommitStepFailed: the watermarks document is unreadable.
        TransientError: from the store.
    """
    doc = await read_watermarks_doc(store, dataset, remember=True)
    return stream_verdict({} if doc is None else doc.streams, mark, job)


__all__ = ["REFUSED_PREFIX", "check_stream", "stream_verdict"]
