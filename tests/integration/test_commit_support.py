"""Helpers for the commit-core tests (real stores, wrapped to inject faults), and tests of the wrappers.

- :class:`ManualLease`: a Lease whose epoch we choose and that we can mark lost.
- :class:`FaultStore`: an ObjectStore wrapper that counts mutating calls and can
  crash the "process" (raise :class:`SimulatedCrash`, a BaseException, and stay
  dead) before or after the k-th one, throttle chosen keys, or pause on a gate.
- :func:`stage_job`: writes real staged files for a job and returns the request.
- :func:`assert_exactly_once`: the exactly-once invariant, checked on the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import pytest

from shared._errors import LockLost, OutcomeUnknown, Throttled
from shared.commit import (
    CommitRequest,
    StagedFile,
    WinningAttempt,
    audit,
    read_manifest,
    read_watermarks,
)
from shared.events import published_key, staged_key, wal_prefix
from shared.settings import CommitSettings, RetrySettings, Settings
from shared.storage import ObjectData, ObjectInfo, ObjectStore

MUTATING = frozenset({"write", "write_if_absent", "write_if_match", "delete", "copy"})


def fast_settings(*, attempts: int = 4, concurrency: int = 4) -> Settings:
    """Settings whose retries never sleep (initial = maximum = 0)."""
    retry = RetrySettings(attempts=attempts, initial=0.0, maximum=0.0, budget=30.0)
    return Settings(commit=CommitSettings(publish_concurrency=concurrency, retry=retry))


class ManualLease:
    """A Lease for tests: fixed name and epoch; ``lose()`` makes ``check()`` raise LockLost."""

    def __init__(self, name: str, epoch: int) -> None:
        self._name = name
        self._epoch = epoch
        self.lost = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def epoch(self) -> int:
        return self._epoch

    def check(self) -> None:
        if self.lost:
            raise LockLost(f"lease {self._name}@{self._epoch} lost (test)")

    def lose(self) -> None:
        self.lost = True


class SimulatedCrash(BaseException):
    """The process died here (a BaseException, so nothing catches it as an error)."""


@dataclass
class FaultStore:
    """Wraps a real store; injects faults into mutating calls as configured.

    ``crash_at``: crash at the k-th mutating call (1-based), ``crash_when``
    ``before`` (the call is not made) or ``after`` (it is made, the answer lost).
    After a crash every call raises SimulatedCrash. ``ops`` records every call (reads
    too) in order; ``calls`` only the mutating ones. ``throttle(key, op)``
    returning True raises Throttled instead of calling (``key`` is the
    destination for a copy). ``unknown_at``: the k-th mutating call raises
    OutcomeUnknown, ``unknown_when`` ``after`` making it or ``before``. ``gate_at``:
    the k-th mutating call waits for ``gate`` before being made, after
    setting ``parked``.
    """

    inner: ObjectStore
    crash_at: int | None = None
    crash_when: str = "before"
    throttle: Callable[[str, str], bool] | None = None
    unknown_at: int | None = None
    unknown_when: str = "after"
    gate_at: int | None = None
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    parked: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[tuple[str, str]] = field(default_factory=list)
    ops: list[tuple[str, str]] = field(default_factory=list)  # every call in order, reads too
    dead: bool = False

    @property
    def url(self) -> str:
        return self.inner.url

    def _check_alive(self) -> None:
        if self.dead:
            raise SimulatedCrash("store used after the crash")

    async def _mutate(self, op: str, key: str, call: Callable[[], object]) -> object:
        self._check_alive()
        if self.throttle is not None and self.throttle(key, op):
            raise Throttled(f"test throttles {op} {key}")
        self.calls.append((op, key))
        self.ops.append((op, key))
        k = len(self.calls)
        if self.gate_at == k:
            self.parked.set()
            await self.gate.wait()
        if self.crash_at == k and self.crash_when == "before":
            self.dead = True
            raise SimulatedCrash(f"crash before {op} {key} (call {k})")
        if self.unknown_at == k and self.unknown_when == "before":
            raise OutcomeUnknown(f"test: outcome of {op} {key} unknown, not made (call {k})")
        try:
            result = await call()  # type: ignore[misc]
        finally:
            if self.crash_at == k:  # crash after the call, whatever it answered
                self.dead = True
                raise SimulatedCrash(f"crash after {op} {key} (call {k})")
        if self.unknown_at == k:
            raise OutcomeUnknown(f"test: outcome of {op} {key} unknown, made (call {k})")
        return result

    async def read(self, key: str) -> ObjectData:
        self._check_alive()
        self.ops.append(("read", key))
        return await self.inner.read(key)

    async def head(self, key: str) -> ObjectInfo:
        self._check_alive()
        self.ops.append(("head", key))
        return await self.inner.head(key)

    async def head_md5(self, key: str) -> ObjectInfo:
        self._check_alive()
        self.ops.append(("head_md5", key))
        return await self.inner.head_md5(key)

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        return await self._mutate("write", key, lambda: self.inner.write(key, data))  # type: ignore[return-value]

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        return await self._mutate("write_if_absent", key, lambda: self.inner.write_if_absent(key, data))  # type: ignore[return-value]

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return await self._mutate(  # type: ignore[return-value]
            "write_if_match", key, lambda: self.inner.write_if_match(key, data, version)
        )

    async def delete(self, key: str) -> None:
        await self._mutate("delete", key, lambda: self.inner.delete(key))

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        return await self._mutate("copy", dst, lambda: self.inner.copy(src, dst, source=source))  # type: ignore[return-value]

    async def list(self, prefix: str = "", *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        self._check_alive()
        async for info in self.inner.list(prefix, page_size=page_size):
            self._check_alive()
            yield info

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


@dataclass
class StagedJob:
    """A job staged for one dataset: the request, and every staged file's bytes by key."""

    req: CommitRequest
    winners: dict[str, bytes]  # staged key -> bytes, winning attempts
    losers: dict[str, bytes]  # staged key -> bytes, losing attempts

    def published(self) -> dict[str, bytes]:
        """Return where each winning file must end up, with its bytes."""
        out = {}
        for w in self.req.winners:
            for f in w.files:
                src = staged_key(self.req.job, self.req.dataset, w.task, w.attempt, f.path)
                out[published_key(self.req.dataset, self.req.job, w.task, f.path)] = self.winners[src]
        return out


async def stage_job(
    store: ObjectStore,
    dataset: str,
    job: str,
    *,
    tasks: int = 2,
    files_per_task: int = 2,
    losers: int = 1,
    with_md5: bool = True,
    marks: dict[str, int] | None = None,
    seed: int = 0,
) -> StagedJob:
    """Stage real files: each task's winning attempt 1 (plus ``losers`` losing attempt 0 of task 0)."""
    rng = random.Random(f"{dataset}/{job}/{seed}")
    winners: dict[str, bytes] = {}
    lost: dict[str, bytes] = {}
    attempts = []
    for task in range(tasks):
        files = []
        for n in range(files_per_task):
            body = rng.randbytes(rng.randint(1, 300))
            path = f"date=2024-01-0{1 + n % 2}/part-{n}.parquet"
            key = staged_key(job, dataset, task, 1, path)
            await store.write(key, body)
            winners[key] = body
            md5 = hashlib.md5(body).hexdigest() if with_md5 else None
            files.append(StagedFile(path=path, size=len(body), md5=md5))
        wm = {f"p{task}": (marks or {}).get(f"p{task}", 100 * (task + 1) + seed)}
        attempts.append(WinningAttempt(task=task, attempt=1, files=files, watermarks=wm))
    for n in range(losers):
        body = rng.randbytes(50)
        key = staged_key(job, dataset, 0, 0, f"loser-{n}.parquet")
        await store.write(key, body)
        lost[key] = body
    req = CommitRequest(dataset=dataset, job=job, winners=attempts, expected_tasks=tasks)
    return StagedJob(req=req, winners=winners, losers=lost)


def is_crash(exc: BaseException) -> bool:
    """True when ``exc`` is a SimulatedCrash, or a group made only of them."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_crash(e) for e in exc.exceptions)
    return isinstance(exc, SimulatedCrash)


async def expect_crash(aw: Awaitable[object]) -> None:
    """Await ``aw`` and require it to end in a simulated crash (re-raise anything else)."""
    try:
        await aw
    except BaseException as exc:
        if not is_crash(exc):
            raise
        return
    raise AssertionError("expected a simulated crash, the call finished")


async def keys(store: ObjectStore, prefix: str = "") -> list[str]:
    """Return every key under ``prefix``."""
    return [i.key async for i in store.list(prefix)]


async def assert_exactly_once(store: ObjectStore, *jobs: StagedJob) -> None:
    """Every winning file published once with its bytes, nothing staged left, manifest present,
    watermarks = max, no log left, and ``audit`` clean."""
    report = await audit(store)
    assert report.ok, report.violations
    assert await keys(store, "_staging/") == []
    assert await keys(store, wal_prefix()) == []
    expected_marks: dict[str, dict[str, int]] = {}
    for job in jobs:
        manifest = await read_manifest(store, job.req.dataset, job.req.job)
        assert manifest is not None
        want = job.published()
        assert sorted(f.key for f in manifest.files) == sorted(want)
        for key, body in want.items():
            assert (await store.read(key)).data == body
        marks = expected_marks.setdefault(job.req.dataset, {})
        for w in job.req.winners:
            for k, v in w.watermarks.items():
                marks[k] = max(marks.get(k, v), v)
    for dataset, marks in expected_marks.items():
        assert await read_watermarks(store, dataset) == marks
        published = [k for k in await keys(store, f"{dataset}/") if not k.startswith(f"{dataset}/_commits/")]
        wanted = [k for j in jobs if j.req.dataset == dataset for k in j.published()]
        assert sorted(published) == sorted(wanted)


# -- tests of the wrappers themselves -------------------------------------------------------------


async def test_fault_store_crashes_before_and_after_the_kth_call(tmp_path: object) -> None:
    from pathlib import Path

    from shared.storage._local import LocalStore

    inner = LocalStore(Path(str(tmp_path)))
    before = FaultStore(inner, crash_at=2, crash_when="before")
    await before.write("a", b"1")
    with pytest.raises(SimulatedCrash):
        await before.write("b", b"2")
    with pytest.raises(SimulatedCrash):
        await before.read("a")
    assert await keys(inner) == ["a"]

    after = FaultStore(inner, crash_at=1, crash_when="after")
    with pytest.raises(SimulatedCrash):
        await after.write("c", b"3")
    assert await keys(inner) == ["a", "c"]


async def test_manual_lease_can_be_lost() -> None:
    lease = ManualLease("ds", 3)
    lease.check()
    lease.lose()
    with pytest.raises(LockLost):
        lease.check()
