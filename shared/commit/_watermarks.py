"""The watermarks step: move a dataset's watermarks forward by compare-and-swap, never back."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

import msgspec

from .._errors import BadInput, NotFound, PreconditionFailed, TransientError
from .._nonce import nonce
from .._recent import GUESS_LIMIT, Recent
from ..events import watermarks_key
from ..storage import ObjectStore
from ._errors import CommitStepFailed
from ._model import StreamRecord, WatermarksDoc
from ._steps import CommitStep, StepContext

# A compare-and-swap that loses this many races in a row is reported as
# transient: with one lock holder per dataset, more than a handful means a
# stale holder or an operator is writing at the same time.
_CAS_ROUNDS = 32

_watermarks_decoder = msgspec.json.Decoder(WatermarksDoc)
_encoder = msgspec.json.Encoder()


def merge_watermarks(current: Mapping[str, int], new: Mapping[str, int]) -> dict[str, int]:
    """Return the per-key maximum of ``current`` and ``new`` (a watermark never moves back)."""
    merged = dict(current)
    for key, value in new.items():
        if key not in merged or value > merged[key]:
            merged[key] = value
    return merged


def _decode_watermarks(data: bytes, key: str) -> WatermarksDoc:
    try:
        return _watermarks_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CommitStepFailed(f"watermarks {key} are unreadable: {exc}") from exc


async def read_watermarks_doc(
    store: ObjectStore, dataset: str, *, remember: bool = False
) -> WatermarksDoc | None:
    """Return the dataset's watermarks document (values and stream records), or None when never written.

    ``remember``: keep what was read as the guess of this process's next
    compare-and-swap of the document (a commit about to write it).

    Raises:
        CommitStepFailed: the document is unreadable.
        TransientError: from the store.
    """
    key = watermarks_key(dataset)
    try:
        obj = await store.read(key)
    except NotFound:
        return None
    except BadInput as exc:  # a link or a non-file in a local store
        raise CommitStepFailed(f"watermarks {key} are unreadable: {exc}") from exc
    doc = _decode_watermarks(obj.data, key)
    if remember:
        _SEEN.put(store.url, key, (dict(doc.values), dict(doc.streams), obj.info.version))
    return doc


async def read_watermarks(store: ObjectStore, dataset: str) -> dict[str, int]:
    """Return the dataset's committed watermarks ({} when none were ever written).

    Raises:
        CommitStepFailed: the watermarks document is unreadable.
    """
    doc = await read_watermarks_doc(store, dataset)
    return {} if doc is None else dict(doc.values)


Streams = dict[str, StreamRecord]
_Doc = tuple[dict[str, int], Streams]


def merge_stream(streams: Mapping[str, StreamRecord], mark: StreamMark | None) -> Streams:
    """Return ``streams`` with ``mark`` recorded when it is newer than the app's record (pure)."""
    merged = dict(streams)
    if mark is not None:
        rec = merged.get(mark.app_id)
        if rec is None or mark.batch > rec.batch:
            merged[mark.app_id] = StreamRecord(batch=mark.batch, query=mark.query, job=mark.job, at=mark.at)
    return merged


def stream_covered(streams: Mapping[str, StreamRecord], mark: StreamMark | None) -> bool:
    """Return True when the app's record is at or past ``mark``'s batch (or there is no mark)."""
    if mark is None:
        return True
    rec = streams.get(mark.app_id)
    return rec is not None and rec.batch >= mark.batch


class _SeenDocs:
    """The watermarks documents this process last read or wrote: (values, streams, version) by store and key.

    A guess for the next compare-and-swap only (a wrong one costs one refused
    write); bounded, oldest forgotten first, so it follows the datasets this
    process works on. Kept compact (issue 9: thousands of entries): the values
    as a tuple of pairs with the watermark names interned, not a dict each.
    """

    def __init__(self, limit: int = GUESS_LIMIT) -> None:
        self._docs: Recent[tuple[tuple[tuple[str, int], ...], tuple[tuple[str, StreamRecord], ...], str]] = (
            Recent(limit)
        )

    def get(self, url: str, key: str) -> tuple[dict[str, int], Streams, str] | None:
        """Return fresh copies of the values and streams last seen, with their version, or None."""
        seen = self._docs.get(url, key)
        return None if seen is None else (dict(seen[0]), dict(seen[1]), seen[2])

    def put(self, url: str, key: str, doc: tuple[dict[str, int], Streams, str]) -> None:
        values = tuple((sys.intern(name), value) for name, value in doc[0].items())
        self._docs.put(url, key, (values, tuple(doc[1].items()), doc[2]))

    def forget(self, url: str, key: str) -> None:
        self._docs.forget(url, key)


_SEEN = _SeenDocs()


class StreamMark(msgspec.Struct, frozen=True, kw_only=True):
    """The micro-batch a streaming commit records (``app_id``, ``batch``, ``query``, the ``job``)."""

    app_id: str
    batch: int
    query: str
    job: str
    at: float = 0.0


class AdvanceWatermarks(CommitStep, frozen=True, kw_only=True, tag="watermarks"):
    """Move the dataset's watermarks forward to at least ``values`` (per-key max, by compare-and-swap).

    ``stream``: the streaming app's micro-batch, recorded in the same document
    (the app's record moves forward only, like a watermark).
    """

    dataset: str
    values: dict[str, int]
    stream: StreamMark | None = None

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when every watermark (and the stream record) is already at or past this step's."""
        doc = await read_watermarks_doc(ctx.store, self.dataset)
        current = {} if doc is None else doc.values
        streams = {} if doc is None else doc.streams
        covered = all(k in current and current[k] >= v for k, v in self.values.items())
        return covered and stream_covered(streams, self.stream)

    async def execute(self, ctx: StepContext) -> None:
        """Read, merge by max, write back conditionally; repeat on a lost race.

        Raises:
            TransientError: the race was lost too many times in a row.
            CommitStepFailed: the stored document is unreadable.
        """
        await self._swap(ctx, None)

    async def ensure(self, ctx: StepContext) -> bool:
        """Compare-and-swap on what this process last saw of the document, without reading it first.

        The document this process last read or wrote (see :class:`_SeenDocs`)
        gives the version to write on: when nobody wrote since, one
        conditional write does it. Never seen: create-if-absent (a dataset's
        first commit). A lost race (``PreconditionFailed``) falls back to
        :meth:`execute`'s read-merge-write loop. When the last seen values
        already cover ``values`` nothing is written: the document is read to
        confirm (watermarks never move back, but the store is the judge).

        Returns:
            True when the watermarks were moved, False when they were in place.
        """
        key = watermarks_key(self.dataset)
        seen = _SEEN.get(ctx.store.url, key)
        if seen is None:
            return await self._swap(ctx, ({}, {}, None))
        if self._merge((seen[0], seen[1])) == (seen[0], seen[1]):
            return await self._swap(ctx, None)
        return await self._swap(ctx, seen)

    async def undo(self, ctx: StepContext) -> None:
        """An operator's ``skip`` rolls this commit back: put the stream record back before its batch.

        Only while the record names this job (a later batch's record stays):
        batch ``b`` goes back to ``b - 1`` of the same query (no job), batch 0
        removes the record, so Spark's rerun of the batch commits it. The
        watermark values never move back (``skip`` refuses a sequence whose
        watermarks are ahead of every manifest).

        Raises:
            TransientError, CommitStepFailed, LockLost: as :func:`swap_watermarks`.
        """
        mark = self.stream
        if mark is None:
            return

        def back(doc: _Doc) -> _Doc:
            values, streams = doc
            rec = streams.get(mark.app_id)
            if rec is None or rec.job != mark.job:
                return doc
            rest = dict(streams)
            if mark.batch == 0:
                del rest[mark.app_id]
            else:
                rest[mark.app_id] = StreamRecord(
                    batch=mark.batch - 1, query=mark.query, job="", at=ctx.clock()
                )
            return values, rest

        def check() -> None:
            ctx.lease.check()

        await swap_watermarks(ctx.store, self.dataset, back, ctx.clock, check)

    def _merge(self, doc: _Doc) -> _Doc:
        return merge_watermarks(doc[0], self.values), merge_stream(doc[1], self.stream)

    async def _swap(self, ctx: StepContext, guess: tuple[dict[str, int], Streams, str | None] | None) -> bool:
        def check() -> None:
            ctx.lease.check()

        return await swap_watermarks(ctx.store, self.dataset, self._merge, ctx.clock, check, guess)


async def swap_watermarks(
    store: ObjectStore,
    dataset: str,
    change: Callable[[_Doc], _Doc],
    clock: Callable[[], float],
    check: Callable[[], None],
    guess: tuple[dict[str, int], Streams, str | None] | None = None,
) -> bool:
    """Write ``change(values, streams)`` over the dataset's document by compare-and-swap; retry lost races.

    ``guess`` is a (values, streams, version) to write on without reading
    first (version None: create-if-absent); ``check`` runs just before each
    write (the lease). Nothing is written when ``change`` changes nothing.

    Returns:
        True when the document was written, False when it was in place.

    Raises:
        TransientError: the race was lost too many times in a row, or the store failed.
        CommitStepFailed: the stored document is unreadable or cannot be written.
        LockLost / Fenced: from ``check``.
    """
    key = watermarks_key(dataset)
    url = store.url
    for _ in range(_CAS_ROUNDS):
        current: _Doc
        if guess is not None:
            current, version = (guess[0], guess[1]), guess[2]
            guess = None
        else:
            try:
                obj = await store.read(key)
            except NotFound:
                current, version = ({}, {}), None
            except BadInput as exc:  # a link or a non-file in a local store
                raise CommitStepFailed(f"watermarks {key} are unreadable: {exc}") from exc
            else:
                doc = _decode_watermarks(obj.data, key)
                current = (dict(doc.values), dict(doc.streams))
                version = obj.info.version
                _SEEN.put(url, key, (current[0], current[1], version))
        merged = change(current)
        if merged == current:
            return False  # in place; or absent and nothing to add (an empty document is not written)
        body = _encoder.encode(
            WatermarksDoc(
                dataset=dataset, values=merged[0], streams=merged[1], updated_at=clock(), nonce=nonce()
            )
        )
        check()
        try:
            if version is None:
                info = await store.write_if_absent(key, body)
            else:
                info = await store.write_if_match(key, body, version)
        except PreconditionFailed:
            _SEEN.forget(url, key)
            continue  # someone else moved them (or our retried write landed): re-read
        except BadInput as exc:  # a link or a non-file in a local store
            _SEEN.forget(url, key)
            raise CommitStepFailed(f"watermarks {key} cannot be written: {exc}") from exc
        except BaseException:
            _SEEN.forget(url, key)  # the write may or may not have landed
            raise
        _SEEN.put(url, key, (merged[0], merged[1], info.version))
        return True
    raise TransientError(f"watermarks {key}: compare-and-swap lost {_CAS_ROUNDS} races in a row")


__all__ = [
    "AdvanceWatermarks",
    "StreamMark",
    "merge_stream",
    "merge_watermarks",
    "read_watermarks",
    "read_watermarks_doc",
    "stream_covered",
    "swap_watermarks",
]
