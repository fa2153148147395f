"""An entry that repeats a field name (``XADD s * data A data B``) is seen by every reader, never read
as one of its values: its fields are an empty ``RepeatedFields`` holding every field as sent.

The reply parsers that replace redis-py's give the same shapes and dicts as redis-py's for every
entry whose names are unique (checked against redis-py's own parsers on the same raw replies).
"""

from __future__ import annotations

import pickle
import random

import pytest
import redis
import redis.asyncio
from redis._parsers import helpers as redis_py

from shared.events import InvalidMessage, RepeatedFields, ValidationLimits, decode_entry
from shared.queue import Entry, entries_from_raw, entries_from_reply, fields_of, keep_repeated_fields
from shared.queue._dead_letters import dead_letter_fields, parse_dead_letter
from shared.queue._entry import StreamRows
from shared.queue._stream_replies import _auto_claimed, _claimed, _rows, _streams
from tests._support.intake_mutations import hostile_entry, repeated_names

LIMITS = ValidationLimits()
GOOD = b'{"type":"job_failed","v":1,"job":"j1","datasets":["d"],"reason":"","failed_at":1}'


def _schema(fields: dict[bytes, bytes]) -> InvalidMessage:
    with pytest.raises(InvalidMessage) as caught:
        decode_entry(fields, limits=LIMITS)
    return caught.value


def test_unique_names_give_a_plain_dict() -> None:
    assert fields_of([b"data", b"x"]) == {b"data": b"x"}
    assert type(fields_of([b"data", b"x", b"sig", b"y"])) is dict
    assert fields_of(None) == {} and fields_of([]) == {}


@pytest.mark.parametrize(
    ("flat", "name"),
    [
        ([b"data", b"A", b"data", b"B"], "data"),
        ([b"data", b"A", b"data", b"A"], "data"),  # the same value twice is still two fields
        ([b"sig", b"s1", b"data", GOOD, b"sig", b"s2"], "sig"),
        ([b"data", GOOD, b"trace", b"1", b"trace", b"2"], "trace"),  # a field nobody reads
        ([b"\xff", b"1", b"data", GOOD, b"\xff", b"2"], "\ufffd"),
    ],
)
def test_a_repeated_name_gives_no_value_and_is_schema_naming_it(flat: list[bytes], name: str) -> None:
    fields = fields_of(flat)
    assert isinstance(fields, RepeatedFields)
    assert not fields and fields.get(b"data") is None and b"data" not in fields  # no value is offered
    assert fields.pairs == tuple(zip(flat[::2], flat[1::2], strict=True))  # every field as sent
    rejected = _schema(fields)
    assert rejected.reason == "schema"
    assert f"repeats the field {name!r} (2 times)" in rejected.detail, rejected.detail
    assert fields.rejection().detail == rejected.detail


def test_several_repeated_names_are_all_named() -> None:
    fields = fields_of([b"data", b"A", b"sig", b"1", b"data", b"B", b"sig", b"2", b"data", b"C"])
    assert isinstance(fields, RepeatedFields)
    assert fields.repeated == {b"data": 3, b"sig": 2}
    assert "repeats the fields 'data' (3 times), 'sig' (2 times)" in fields.rejection().detail


def test_repeated_fields_compare_by_what_was_sent_and_survive_pickling() -> None:
    a = RepeatedFields([(b"data", b"A"), (b"data", b"B")])
    assert a == RepeatedFields([(b"data", b"A"), (b"data", b"B")])
    assert a != RepeatedFields([(b"data", b"B"), (b"data", b"A")])
    assert a != {} and {} != a  # noqa: SIM300  # an empty dict is not an entry that repeated a name
    assert pickle.loads(pickle.dumps(a)) == a
    assert "b'data'" in repr(a)


def test_entries_from_raw_see_a_repeated_name() -> None:
    raw = [
        [b"1-0", [b"data", b"A", b"data", b"B"]],
        [b"1-1", [b"data", GOOD]],
        [b"1-2", None],  # deleted while pending
    ]
    repeated, good, deleted = entries_from_raw(raw)
    assert isinstance(repeated.fields, RepeatedFields) and not repeated.deleted
    assert good.fields == {b"data": GOOD} and not good.deleted
    assert deleted.fields == {} and deleted.deleted


def test_entries_from_reply_refuse_rows_redis_py_parsed() -> None:
    flat = [b"data", b"A", b"data", b"B"]
    theirs = redis_py.parse_xread([[b"s", [[b"1-0", flat]]]])
    assert theirs[0][1][0][1] == {b"data": b"B"}  # what redis-py makes of it: the last value, silently
    with pytest.raises(TypeError, match="keep_repeated_fields"):
        entries_from_reply(theirs)
    assert entries_from_reply([]) == [] and entries_from_reply([[b"s", []]]) == []
    (entry,) = entries_from_reply(_streams([[b"s", [[b"1-0", flat]]]]))
    assert entry == Entry(b"1-0", RepeatedFields([(b"data", b"A"), (b"data", b"B")]))


def _raw_rows(rng: random.Random, n: int) -> list[list[object]]:
    rows: list[list[object]] = []
    for i in range(n):
        pairs = hostile_entry(rng, ["d1", "d2"], "other", b"k")[1]
        rows.append([f"{i}-0".encode(), [x for pair in pairs for x in pair]])
    return rows


def test_the_parsers_give_redis_py_shapes_for_unique_names() -> None:
    rng = random.Random(5)
    rows = _raw_rows(rng, 400)
    unique = [r for r in rows if not repeated_names(list(zip(r[1][::2], r[1][1::2], strict=True)))]  # type: ignore[index]
    assert len(unique) < len(rows)  # the sample has both kinds
    ours, theirs = _rows(unique), redis_py.parse_stream_list(unique)
    assert type(ours) is StreamRows and ours == theirs
    assert _rows(unique, claim_min_idle_time=5) == redis_py.parse_stream_list(unique, claim_min_idle_time=5)
    assert _streams([[b"s", unique]]) == redis_py.parse_xread([[b"s", unique]])  # RESP2
    assert _streams({b"s": unique}) == redis_py.parse_xread_resp3_to_resp2_legacy({b"s": unique})  # RESP3
    assert _streams(None) == redis_py.parse_xread(None) == []
    assert _claimed(unique) == redis_py.parse_xclaim(unique)
    ids = [r[0] for r in unique]
    assert _claimed(ids, parse_justid=True) == redis_py.parse_xclaim(ids, parse_justid=True)
    assert _auto_claimed([b"0-0", unique, []]) == redis_py.parse_xautoclaim([b"0-0", unique, []])
    assert _auto_claimed([b"0-0", ids, []], parse_justid=True) == ids
    assert _rows([None]) == [(None, None)] and _rows(None) is None
    # And every row with a repeated name is an empty RepeatedFields holding it as sent.
    for (entry_id, fields), raw in zip(_rows(rows) or [], rows, strict=True):
        assert entry_id == raw[0]
        if isinstance(fields, RepeatedFields):
            assert not fields and [x for pair in fields.pairs for x in pair] == raw[1]


def test_a_dead_letter_keeps_every_field_as_sent_and_reads_back_as_repeated() -> None:
    entry = Entry(b"5-1", fields_of([b"data", b"A", b"sig", b"s", b"data", b"B"]))
    dl = dead_letter_fields(entry, shard=2, reason="schema", detail="d", consumer="w1", now_ms=7)
    assert [p for p in dl if p[0].startswith(b"orig.")] == [  # as sent (data and sig first)
        (b"orig.data", b"A"),
        (b"orig.sig", b"s"),
        (b"orig.data", b"B"),
    ]
    back = parse_dead_letter(2, Entry(b"9-0", fields_of([x for pair in dl for x in pair])))
    assert (back.reason, back.detail, back.stream_id, back.consumer, back.dead_at_ms) == (
        "schema",
        "d",
        b"5-1",
        "w1",
        7,
    )
    assert not back.truncated
    assert back.fields == RepeatedFields([(b"data", b"A"), (b"sig", b"s"), (b"data", b"B")])


def test_keep_repeated_fields_sets_a_client_up_once_and_refuses_other_shapes() -> None:
    client = redis.asyncio.Redis()
    assert keep_repeated_fields(keep_repeated_fields(client)) is client
    assert client.response_callbacks["XREADGROUP"] is _streams
    assert redis.Redis().response_callbacks["XRANGE"] is redis_py.parse_stream_list  # others untouched
    keep_repeated_fields(redis.Redis())  # the blocking client too
    with pytest.raises(TypeError, match="XREAD"):
        keep_repeated_fields(redis.asyncio.Redis(protocol=3))  # another shape: refused, not replaced
    with pytest.raises(TypeError, match="cannot set up"):
        keep_repeated_fields(object())
