"""The watermarks step: move a dataset's watermarks forward by compare-and-swap, never back."""

from __future__ import annotations

import sys
from collections.abc import Mapping

import msgspec

from .._errors import BadInput, NotFound, PreconditionFailed, TransientError
from .._nonce import nonce
from .._recent import GUESS_LIMIT, Recent
from ..events import watermarks_key
from ..storage import ObjectStore
from ._errors import CommitStepFailed
from ._model import WatermarksDoc
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


async def read_watermarks(store: ObjectStore, dataset: str) -> dict[str, int]:
    """Return the dataset's committed watermarks ({} when none were ever written).

    Raises:
        CommitStepFailed: the watermarks document is unreadable.
    """
    key = watermarks_key(dataset)
    try:
        obj = await store.read(key)
    except NotFound:
        return {}
    except BadInput as exc:  # a link or a non-file in a local store
        raise CommitStepFailed(f"watermarks {key} are unreadable: {exc}") from exc
    return dict(_decode_watermarks(obj.data, key).values)


class _SeenDocs:
    """The watermarks documents this process last read or wrote: (values, version) by store and key.

    A guess for the next compare-and-swap only (a wrong one costs one refused
    write); bounded, oldest forgotten first, so it follows the datasets this
    process works on. Kept compact (issue 9: thousands of entries): the values
    as a tuple of pairs with the watermark names interned, not a dict each.
    """

    def __init__(self, limit: int = GUESS_LIMIT) -> None:
        self._docs: Recent[tuple[tuple[tuple[str, int], ...], str]] = Recent(limit)

    def get(self, url: str, key: str) -> tuple[dict[str, int], str] | None:
        """Return a fresh copy of the values last seen, with their version, or None."""
        seen = self._docs.get(url, key)
        return None if seen is None else (dict(seen[0]), seen[1])

    def put(self, url: str, key: str, doc: tuple[dict[str, int], str]) -> None:
        values = tuple((sys.intern(name), value) for name, value in doc[0].items())
        self._docs.put(url, key, (values, doc[1]))

    def forget(self, url: str, key: str) -> None:
        self._docs.forget(url, key)


_SEEN = _SeenDocs()


class AdvanceWatermarks(CommitStep, frozen=True, kw_only=True, tag="watermarks"):
    """Move the dataset's watermarks forward to at least ``values`` (per-key max, by compare-and-swap)."""

    dataset: str
    values: dict[str, int]

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when every watermark is already at or past ``values``."""
        current = await read_watermarks(ctx.store, self.dataset)
        return all(k in current and current[k] >= v for k, v in self.values.items())

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
            return await self._swap(ctx, ({}, None))
        merged = merge_watermarks(seen[0], self.values)
        if merged == seen[0]:
            return await self._swap(ctx, None)
        return await self._swap(ctx, seen)

    async def _swap(self, ctx: StepContext, guess: tuple[dict[str, int], str | None] | None) -> bool:
        key = watermarks_key(self.dataset)
        url = ctx.store.url
        for _ in range(_CAS_ROUNDS):
            if guess is not None:
                current, version = guess
                guess = None
            else:
                try:
                    obj = await ctx.store.read(key)
                except NotFound:
                    current, version = {}, None
                except BadInput as exc:  # a link or a non-file in a local store
                    raise CommitStepFailed(f"watermarks {key} are unreadable: {exc}") from exc
                else:
                    current = dict(_decode_watermarks(obj.data, key).values)
                    version = obj.info.version
                    _SEEN.put(url, key, (current, version))
            merged = merge_watermarks(current, self.values)
            if version is not None and merged == current:
                return False
            body = _encoder.encode(
                WatermarksDoc(dataset=self.dataset, values=merged, updated_at=ctx.clock(), nonce=nonce())
            )
            ctx.lease.check()
            try:
                if version is None:
                    info = await ctx.store.write_if_absent(key, body)
                else:
                    info = await ctx.store.write_if_match(key, body, version)
            except PreconditionFailed:
                _SEEN.forget(url, key)
                continue  # someone else moved them (or our retried write landed): re-read
            except BadInput as exc:  # a link or a non-file in a local store
                _SEEN.forget(url, key)
                raise CommitStepFailed(f"watermarks {key} cannot be written: {exc}") from exc
            except BaseException:
                _SEEN.forget(url, key)  # the write may or may not have landed
                raise
            _SEEN.put(url, key, (merged, info.version))
            return True
        raise TransientError(f"watermarks {key}: compare-and-swap lost {_CAS_ROUNDS} races in a row")


__all__ = ["AdvanceWatermarks", "merge_watermarks", "read_watermarks"]
