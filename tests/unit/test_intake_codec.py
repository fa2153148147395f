"""The decoder is total: whatever the bytes of an entry, it returns an event or raises InvalidMessage.

Also: the dead-letter copy of any entry is well formed (bytes only, bounded)
and keeps every field as sent (a repeated name included), and every reject
reason a detail can carry is one line of valid UTF-8.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.events import (
    REJECT_REASONS,
    InvalidMessage,
    QueueEvent,
    RepeatedFields,
    ValidationLimits,
    decode_admin,
    decode_entry,
    encode_event,
    sign,
)
from shared.queue import Entry, fields_of
from shared.queue._dead_letters import MAX_COPIED_FIELDS, ORIG_PREFIX, dead_letter_fields, parse_dead_letter
from tests._support.intake_mutations import BAD_UTF8, MUTATIONS, hostile_entry, repeated_names

SECRET = b"s3cret"
DATASETS = ["d1", "d2", "sales"]


def _outcome(fields: dict[bytes, bytes], limits: ValidationLimits) -> QueueEvent | InvalidMessage:
    try:
        return decode_entry(fields, limits=limits)
    except InvalidMessage as exc:
        rejected = exc
    assert rejected.reason in REJECT_REASONS
    assert "\n" not in rejected.detail
    rejected.detail.encode("utf-8")  # never raises: details are valid text
    return rejected


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**64), signed=st.booleans())
def test_any_mutated_entry_decodes_or_is_rejected(seed: int, signed: bool) -> None:
    rng = random.Random(seed)
    secret = SECRET if signed else None
    limits = ValidationLimits(secret=secret, max_message_bytes=1 << 20)
    _kind, pairs = hostile_entry(rng, DATASETS, "other", secret)
    fields = fields_of([x for pair in pairs for x in pair])  # as every reader of entries builds them
    out = _outcome(fields, limits)
    repeated = repeated_names(pairs)
    if repeated:
        assert isinstance(fields, RepeatedFields) and not fields, fields
        assert isinstance(out, InvalidMessage) and out.reason == "schema", out
        assert all(repr(n.decode("utf-8", "replace")) in out.detail for n in repeated), out.detail
    elif not isinstance(out, InvalidMessage):
        # What is accepted survives a round trip unchanged.
        assert decode_entry({b"data": encode_event(out)}, limits=ValidationLimits()) == out
    dl = dead_letter_fields(
        Entry(b"1-1", fields), shard=3, reason="internal", detail="x\ud800", consumer="w", now_ms=1
    )
    assert all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in dl)
    if len(pairs) <= MAX_COPIED_FIELDS:  # nothing lost: every field as sent, repeats included
        copied = [(k[len(ORIG_PREFIX) :], v) for k, v in dl if k.startswith(ORIG_PREFIX)]
        assert sorted(copied) == sorted(pairs)
        back = parse_dead_letter(3, Entry(b"9-0", fields_of([x for pair in dl for x in pair]))).fields
        assert sorted(back.pairs if isinstance(back, RepeatedFields) else back.items()) == sorted(pairs)
        assert isinstance(back, RepeatedFields) == bool(repeated)


@settings(max_examples=2000, deadline=None)
@given(data=st.binary(max_size=300), sig=st.one_of(st.none(), st.binary(max_size=80), st.text(max_size=80)))
def test_arbitrary_bytes_decode_or_are_rejected(data: bytes, sig: bytes | str | None) -> None:
    for secret in (None, SECRET):
        fields: dict[bytes, bytes | str] = {b"data": data}
        if sig is not None:
            fields[b"sig"] = sig
        _outcome(fields, ValidationLimits(secret=secret))  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage):
        decode_admin(data + b"\xff")


@pytest.mark.parametrize("bad", BAD_UTF8)
@pytest.mark.parametrize("signed", [False, True])
def test_invalid_utf8_inside_a_string_is_bad_json(bad: bytes, signed: bool) -> None:
    data = (
        b'{"type":"task_finished","v":1,"job":"j","dataset":"d' + bad + b'","task":0,"attempt":0,'
        b'"files":[],"finished_at":1}'
    )
    fields = {b"data": data}
    if signed:
        fields[b"sig"] = sign(data, SECRET)
    with pytest.raises(InvalidMessage) as caught:
        decode_entry(fields, limits=ValidationLimits(secret=SECRET if signed else None))
    assert caught.value.reason == "bad_json"


def test_data_field_of_odd_types_is_rejected_not_raised() -> None:
    limits = ValidationLimits()
    for value, reason in (
        (5, "schema"),
        (None, "schema"),
        ("x\udc80", "bad_json"),
        (bytearray(b"{"), "bad_json"),
    ):
        with pytest.raises(InvalidMessage) as caught:
            decode_entry({"data": value}, limits=limits)  # type: ignore[dict-item]
        assert caught.value.reason == reason
    with pytest.raises(InvalidMessage) as caught:
        decode_entry({b"data": b"{}", b"sig": 7}, limits=ValidationLimits(secret=SECRET))  # type: ignore[dict-item]
    assert caught.value.reason == "bad_signature"


def test_upper_case_hex_signature_is_accepted() -> None:
    data = (
        b'{"type":"job_failed","v":1,"job":"j1","datasets":["sales"],"reason":"oom","failed_at":1717171800.0}'
    )
    limits = ValidationLimits(secret=SECRET)
    assert decode_entry({b"data": data, b"sig": sign(data, SECRET).upper()}, limits=limits).job == "j1"
    mixed = sign(data, SECRET).decode()
    mixed = mixed[:10].upper() + mixed[10:]
    assert decode_entry({b"data": data, b"sig": mixed.encode()}, limits=limits).job == "j1"


def test_duplicate_json_keys_last_wins_but_type_cannot_change() -> None:
    limits = ValidationLimits()
    data = b'{"type":"job_failed","v":1,"job":"a","job":"b","datasets":["d"],"reason":"","failed_at":1}'
    assert decode_entry({b"data": data}, limits=limits).job == "b"
    data = (
        b'{"type":"job_failed","type":"job_cancelled","v":1,"job":"a","datasets":["d"],'
        b'"reason":"","cancelled_at":1}'
    )
    with pytest.raises(InvalidMessage) as caught:
        decode_entry({b"data": data}, limits=limits)
    assert caught.value.reason == "schema"


def test_dead_letter_copy_is_bounded_in_fields_and_bytes() -> None:
    fields = {f"f{i}".encode(): b"v" * 100 for i in range(10_000)}
    fields[b"data"] = b"x" * 5000
    dl = dict(
        dead_letter_fields(
            Entry(b"1-1", fields),
            shard=0,
            reason="schema",
            detail="d",
            consumer="w",
            now_ms=1,
            max_copy_bytes=1000,
        )
    )
    copied = [k for k in dl if k.startswith(b"orig.")]
    assert len(copied) == MAX_COPIED_FIELDS
    assert b"orig.data" in dl  # the fields that matter come first
    assert len(dl[b"orig.data"]) == 1000
    assert dl[b"truncated"] == b"1"


def test_every_mutation_kind_is_exercised() -> None:
    rng = random.Random(7)
    kinds = {hostile_entry(rng, DATASETS, "other", None)[0] for _ in range(2000)}
    assert kinds == set(MUTATIONS)


def test_every_kind_of_repeated_field_name_is_exercised() -> None:
    rng = random.Random(7)
    names: set[bytes] = set()
    for _ in range(2000):
        names |= repeated_names(hostile_entry(rng, DATASETS, "other", SECRET)[1])
    assert {b"data", b"sig"} < names, names  # and a field nobody reads
