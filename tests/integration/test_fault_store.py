"""The test wrappers themselves: the fault-injecting store and the manual lease (tests/_support)."""

from __future__ import annotations

import pytest

from shared import LockLost
from tests._support.commit import ManualLease, keys
from tests._support.fault_store import Fault, FaultStore, SimulatedCrash


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


async def test_fault_rules_fail_the_matching_calls_before_or_after_making_them(tmp_path: object) -> None:
    from pathlib import Path

    from shared import PreconditionFailed
    from shared.storage._local import LocalStore

    inner = LocalStore(Path(str(tmp_path)))
    store = FaultStore(inner)
    store.faults.append(Fault("write_if_absent", PreconditionFailed, when=lambda data: data == b"no"))
    store.faults.append(Fault("write_if_absent", PreconditionFailed, after=True, times=2))
    with pytest.raises(PreconditionFailed):
        await store.write_if_absent("a", b"no")  # the first rule: not made
    with pytest.raises(PreconditionFailed):
        await store.write_if_absent("b", b"yes")  # the second: made, then refused
    with pytest.raises(PreconditionFailed):
        await store.write_if_absent("c", b"no")  # the first is spent: the second, made
    await store.write_if_absent("d", b"ok")  # every rule spent
    assert await keys(inner) == ["b", "c", "d"]
    assert [f.hits for f in store.faults] == [1, 2]
