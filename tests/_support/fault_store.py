"""The fault-injecting store wrapper of the tests: a real store whose calls fail where a test says.

:class:`FaultStore` forwards every call to the real store it wraps, and can:

- count the mutating calls and crash the "process" before or after the k-th
  one (raise :class:`SimulatedCrash`, a BaseException, and stay dead), make
  the k-th raise OutcomeUnknown (made or not), park the k-th on a gate, and
  throttle chosen keys (the commit-core tests);
- apply :class:`Fault` rules: raise an error on the next calls of a method
  whose written bytes match a predicate, before or after making the call, or
  make the call never answer (the storage-lock tests: a write that took
  effect but answers 412 is the "ghost lock").

(The product's ``FaultyStore``, shared/storage/_faults.py, is another thing:
random faults at a rate, turned on by the ``store.chaos_fault_rate`` setting
of a real fleet, which the chaos tests run.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from shared import OutcomeUnknown, Throttled
from shared.storage import ObjectData, ObjectInfo, ObjectStore

MUTATING = frozenset({"write", "write_if_absent", "write_if_match", "delete", "copy"})


class SimulatedCrash(BaseException):
    """The process died here (a BaseException, so nothing catches it as an error)."""


@dataclass
class Fault:
    """Raise ``error`` on the next ``times`` calls of ``method`` whose written bytes match ``when``.

    ``after=True`` performs the real call first (the write lands, the answer says otherwise);
    ``hang=True`` performs it (if ``after``) and then never answers.
    """

    method: str
    error: type[BaseException] | None
    after: bool = False
    hang: bool = False
    times: int = 1
    when: Callable[[bytes], bool] = lambda _data: True
    hits: int = 0


@dataclass
class FaultStore:
    """Wraps a real store; injects faults into mutating calls as configured (see the module doc).

    ``crash_at``: crash at the k-th mutating call (1-based), ``crash_when``
    ``before`` (the call is not made) or ``after`` (it is made, the answer lost).
    After a crash every call raises SimulatedCrash. ``ops`` records every call (reads
    too) in order; ``calls`` only the mutating ones. ``throttle(key, op)``
    returning True raises Throttled instead of calling (``key`` is the
    destination for a copy). ``unknown_at``: the k-th mutating call raises
    OutcomeUnknown, ``unknown_when`` ``after`` making it or ``before``. ``gate_at``:
    the k-th mutating call waits for ``gate`` before being made, after
    setting ``parked``. ``faults``: the :class:`Fault` rules, the first match
    applying (a rule's call is not counted).
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
    faults: list[Fault] = field(default_factory=list)
    dead: bool = False

    @property
    def url(self) -> str:
        return self.inner.url

    def _check_alive(self) -> None:
        if self.dead:
            raise SimulatedCrash("store used after the crash")

    def _rule(self, op: str, data: bytes) -> Fault | None:
        for fault in self.faults:
            if fault.method == op and fault.hits < fault.times and fault.when(data):
                return fault
        return None

    async def _mutate(self, op: str, key: str, call: Callable[[], object], data: bytes = b"") -> object:
        self._check_alive()
        fault = self._rule(op, data)
        if fault is not None:
            fault.hits += 1
            if fault.after:
                await call()  # type: ignore[misc]
            if fault.hang:
                await asyncio.Event().wait()
            assert fault.error is not None
            raise fault.error(f"injected {fault.error.__name__} on {op}")
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
        return await self._mutate("write", key, lambda: self.inner.write(key, data), data)  # type: ignore[return-value]

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        return await self._mutate(  # type: ignore[return-value]
            "write_if_absent", key, lambda: self.inner.write_if_absent(key, data), data
        )

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return await self._mutate(  # type: ignore[return-value]
            "write_if_match", key, lambda: self.inner.write_if_match(key, data, version), data
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


def is_crash(exc: BaseException) -> bool:
    """Return True when ``exc`` is a SimulatedCrash, or a group made only of them."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_crash(e) for e in exc.exceptions)
    return isinstance(exc, SimulatedCrash)


async def expect_crash(aw: Awaitable[object]) -> None:
    """Await ``aw`` and require it to end in a simulated crash (re-raise anything else).

    Raises AssertionError when ``aw`` finishes.
    """
    try:
        await aw
    except BaseException as exc:
        if not is_crash(exc):
            raise
        return
    raise AssertionError("expected a simulated crash, the call finished")
