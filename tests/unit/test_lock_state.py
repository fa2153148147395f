"""The storage lock's pure decisions: record codec, acquire decision, write resolution, timing."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared._errors import BadInput
from shared.locks._state import (
    RECORD_VERSION,
    Create,
    LockRecord,
    Observed,
    Ours,
    Resolution,
    TakeOver,
    Wait,
    claim_record,
    decide_acquire,
    decode_record,
    encode_record,
    held_until,
    is_held,
    local_deadline,
    lock_key,
    next_epoch,
    poll_delay,
    released_record,
    renewed_record,
    resolve_holder_write,
)
from shared.settings import LockSettings

S = LockSettings(validity=30.0, renew_interval=10.0, max_drift=0.5, poll_min=0.05, poll_max=2.0)
T0 = 1_700_000_000.0


def rec(**kw: object) -> LockRecord:
    base: dict[str, object] = {
        "owner": "a",
        "epoch": 3,
        "acquired_at": T0,
        "expires_at": T0 + 30,
        "released": False,
        "nonce": "n1",
    }
    base.update(kw)
    return LockRecord(**base)  # type: ignore[arg-type]


times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
records = st.builds(
    LockRecord,
    owner=names,
    epoch=st.integers(min_value=1, max_value=2**53),
    acquired_at=times,
    expires_at=times,
    released=st.booleans(),
    nonce=st.text(alphabet="0123456789abcdef", min_size=1, max_size=16),
)


@st.composite
def settings(draw: st.DrawFn) -> LockSettings:
    validity = draw(st.floats(min_value=0.4, max_value=600))
    return LockSettings(
        validity=validity,
        renew_interval=validity / 4,
        max_drift=draw(st.floats(min_value=0, max_value=validity / 4)),
        poll_min=draw(st.floats(min_value=0.001, max_value=0.5)),
        poll_max=1.0,
    )


# -- keys and the record codec ---------------------------------------------------------


def test_lock_key_is_one_object_per_name() -> None:
    assert lock_key("sales.orders") == "_locks/sales.orders.json"
    assert lock_key("ds-1_x=2") == "_locks/ds-1_x=2.json"
    # Fleet-wide locks (the coordinator's election) start with "_", which no dataset name can.
    assert lock_key("_coordinator") == "_locks/_coordinator.json"


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "..", ".x", "-x", "a b", "x" * 129, "é", "a\\b"])
def test_lock_key_rejects_unsafe_names(bad: str) -> None:
    with pytest.raises(BadInput):
        lock_key(bad)


@given(records)
def test_record_round_trips(r: LockRecord) -> None:
    assert decode_record(encode_record(r)) == r


def test_record_json_has_the_documented_fields() -> None:
    body = msgspec.json.decode(encode_record(rec()))
    assert body == {
        "v": RECORD_VERSION,
        "owner": "a",
        "epoch": 3,
        "acquired_at": T0,
        "expires_at": T0 + 30,
        "released": False,
        "nonce": "n1",
    }


def test_record_is_frozen() -> None:
    with pytest.raises(AttributeError):
        rec().epoch = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b'{"owner": "a"}',
        b'{"v": 2, "owner": "a", "epoch": 1, "acquired_at": 1, "expires_at": 2, "nonce": "n"}',
        b'{"v": 1, "owner": "", "epoch": 1, "acquired_at": 1, "expires_at": 2, "nonce": "n"}',
        b'{"v": 1, "owner": "a", "epoch": 0, "acquired_at": 1, "expires_at": 2, "nonce": "n"}',
        b'{"v": 1, "owner": "a", "epoch": 1, "acquired_at": 1, "expires_at": 2, "nonce": ""}',
        b'{"v": 1, "owner": "a", "epoch": "1", "acquired_at": 1, "expires_at": 2, "nonce": "n"}',
    ],
)
def test_decode_rejects_what_is_not_a_valid_record(data: bytes) -> None:
    with pytest.raises(BadInput):
        decode_record(data)


def test_decode_ignores_unknown_fields_of_known_version() -> None:
    data = b'{"v": 1, "owner": "a", "epoch": 1, "acquired_at": 1, "expires_at": 2, "nonce": "n", "x": 5}'
    assert decode_record(data).owner == "a"


# -- the acquire decision ---------------------------------------------------------------


def test_no_object_means_create() -> None:
    assert decide_acquire(None, now=T0, owner="me", nonces=(), settings=S) == Create()


def test_held_lock_means_wait_until_expiry_plus_drift() -> None:
    r = rec(expires_at=T0 + 10)
    d = decide_acquire(Observed(r, "v1"), now=T0, owner="me", nonces=(), settings=S)
    assert d == Wait(until=T0 + 10 + S.max_drift, holder=r)


def test_expiry_counts_only_after_drift_allowance() -> None:
    r = rec(expires_at=T0)
    ob = Observed(r, "v1")
    assert isinstance(decide_acquire(ob, now=T0 + S.max_drift, owner="me", nonces=(), settings=S), Wait)
    d = decide_acquire(ob, now=T0 + S.max_drift + 1e-3, owner="me", nonces=(), settings=S)
    assert d == TakeOver(version="v1", previous=r, reason="expired")


def test_released_lock_is_taken_at_once() -> None:
    r = rec(released=True, expires_at=T0 + 1000)
    d = decide_acquire(Observed(r, "v9"), now=T0, owner="me", nonces=(), settings=S)
    assert d == TakeOver(version="v9", previous=r, reason="released")


def test_our_own_claim_is_recognised_by_owner_and_nonce() -> None:
    r = rec(owner="me", nonce="mine")
    d = decide_acquire(Observed(r, "v2"), now=T0, owner="me", nonces={"mine", "other"}, settings=S)
    assert d == Ours(version="v2", record=r)


def test_same_owner_with_unknown_nonce_is_not_ours() -> None:
    # A previous incarnation with the same owner id may still be running (frozen):
    # only a nonce we wrote proves the write is ours.
    r = rec(owner="me", nonce="old")
    d = decide_acquire(Observed(r, "v2"), now=T0, owner="me", nonces={"mine"}, settings=S)
    assert isinstance(d, Wait)


def test_our_released_claim_is_not_held() -> None:
    r = rec(owner="me", nonce="mine", released=True)
    d = decide_acquire(Observed(r, "v2"), now=T0, owner="me", nonces={"mine"}, settings=S)
    assert isinstance(d, TakeOver)


@given(records, times, settings(), st.booleans())
def test_decision_is_consistent_with_is_held(r: LockRecord, now: float, s: LockSettings, mine: bool) -> None:
    nonces = {r.nonce} if mine else set()
    d = decide_acquire(Observed(r, "v"), now=now, owner=r.owner, nonces=nonces, settings=s)
    if mine and not r.released:
        assert isinstance(d, Ours)
    elif is_held(r, now, s):
        assert isinstance(d, Wait)
        assert d.until == held_until(r, s) >= now
    else:
        assert isinstance(d, TakeOver)
        assert d.reason == ("released" if r.released else "expired")
        assert r.released or now > r.expires_at + s.max_drift


# -- builders -----------------------------------------------------------------------------


def test_epochs_start_at_one_and_go_up_by_one() -> None:
    assert next_epoch(None) == 1
    assert next_epoch(rec(epoch=41)) == 42


@given(records, times, settings())
def test_claim_raises_the_epoch_by_exactly_one(prev: LockRecord, now: float, s: LockSettings) -> None:
    for reason in ("released", "expired"):
        new = claim_record(TakeOver("v", prev, reason), owner="me", now=now, nonce="x", settings=s)
        assert new.epoch == prev.epoch + 1
        assert (new.owner, new.nonce, new.released) == ("me", "x", False)
        assert new.acquired_at == now
        assert new.expires_at == now + s.validity
    assert claim_record(Create(), owner="me", now=now, nonce="x", settings=s).epoch == 1


@given(records, times, settings())
def test_renewal_keeps_owner_and_epoch_and_changes_the_bytes(
    held: LockRecord, now: float, s: LockSettings
) -> None:
    new = renewed_record(held, now=now, nonce=held.nonce + "z", settings=s)
    assert (new.owner, new.epoch, new.acquired_at, new.released) == (
        held.owner,
        held.epoch,
        held.acquired_at,
        held.released,
    )
    assert new.expires_at == now + s.validity
    assert encode_record(new) != encode_record(held)


def test_release_marks_released_and_keeps_epoch() -> None:
    held = rec(expires_at=T0 + 30)
    out = released_record(held, now=T0 + 5, nonce="n2")
    assert out.released and out.epoch == held.epoch and out.owner == held.owner
    assert out.expires_at == T0 + 5
    assert out.nonce == "n2"


# -- resolving an ambiguous holder write --------------------------------------------------


def test_resolution_sees_our_landed_write() -> None:
    cur = Observed(rec(owner="me", epoch=3, nonce="new"), "v2")
    got = resolve_holder_write(cur, owner="me", epoch=3, known_version="v1", nonces={"new"})
    assert got is Resolution.OURS


def test_resolution_sees_nothing_landed() -> None:
    cur = Observed(rec(owner="me", epoch=3, nonce="old"), "v1")
    got = resolve_holder_write(cur, owner="me", epoch=3, known_version="v1", nonces={"new"})
    assert got is Resolution.UNCHANGED


@pytest.mark.parametrize(
    "current",
    [
        None,
        Observed(rec(owner="other", epoch=4, nonce="new"), "v2"),
        # Same owner id, newer epoch: a later holding by another incarnation.
        Observed(rec(owner="me", epoch=4, nonce="new"), "v2"),
        Observed(rec(owner="me", epoch=3, nonce="elsewhere"), "v2"),
    ],
)
def test_resolution_sees_the_lock_is_gone(current: Observed | None) -> None:
    got = resolve_holder_write(current, owner="me", epoch=3, known_version="v1", nonces={"new"})
    assert got is Resolution.SUPERSEDED


# -- timing -----------------------------------------------------------------------------------


def test_local_deadline_leaves_the_drift_margin() -> None:
    assert local_deadline(100.0, S) == 100.0 + S.validity - S.max_drift


@given(settings(), times, st.floats(min_value=0, max_value=4e9), st.booleans())
def test_holder_stops_before_anyone_may_take_over(
    s: LockSettings, start_wall: float, skew_fraction: float, ahead: bool
) -> None:
    # Holder sends its write at monotonic 0 / wall start_wall; another host's clock
    # differs by at most max_drift. The first wall time at which the other host
    # may take over corresponds to a real elapsed time >= the holder's local deadline.
    skew = (skew_fraction / 4e9) * s.max_drift * (1 if ahead else -1)
    r = rec(acquired_at=start_wall, expires_at=start_wall + s.validity)
    takeover_other_clock = held_until(r, s)
    elapsed_real = takeover_other_clock - skew - start_wall
    assert elapsed_real >= local_deadline(0.0, s) - 1e-6


def test_settings_defaults_renew_well_inside_validity() -> None:
    d = LockSettings()
    assert d.renew_interval * 3 <= d.validity
    assert d.max_drift < d.validity - 2 * d.renew_interval


@given(st.integers(min_value=0, max_value=200), settings(), st.integers(0, 2**32))
def test_poll_delay_stays_between_min_and_max(attempt: int, s: LockSettings, seed: int) -> None:
    d = poll_delay(attempt, now=0.0, until=None, settings=s, rng=random.Random(seed))
    assert s.poll_min <= d <= s.poll_max


@given(st.integers(min_value=0, max_value=50), st.floats(min_value=0, max_value=0.04))
def test_poll_delay_never_sleeps_past_the_expiry(attempt: int, left: float) -> None:
    d = poll_delay(attempt, now=T0, until=T0 + left, settings=S, rng=random.Random(1))
    assert d <= left + 0.0011


def test_poll_delay_grows_with_attempts() -> None:
    rng = random.Random(7)
    early = max(poll_delay(0, now=0, until=None, settings=S, rng=rng) for _ in range(200))
    late = max(poll_delay(10, now=0, until=None, settings=S, rng=rng) for _ in range(200))
    assert early <= S.poll_min + 1e-9
    assert late > 1.0
