"""The queue-event codec: round trips, every rejection reason, signing, hostile input."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import BadInput
from shared.events import (
    REJECT_REASONS,
    DatasetExpectation,
    InvalidMessage,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TaskFinished,
    ValidationLimits,
    check_task_index,
    decode_entry,
    decode_event,
    encode_event,
    entry_fields,
    sign,
)
from shared.settings import SecuritySettings
from tests._support.event_examples import EXAMPLES, raw, task_finished

LIMITS = ValidationLimits()
SECRET = b"s3cret"
SIGNED = ValidationLimits(secret=SECRET)


def reject(
    data: bytes | dict[str, Any], limits: ValidationLimits = LIMITS, sig: bytes | None = None
) -> InvalidMessage:
    body = json.dumps(data).encode() if isinstance(data, dict) else data
    with pytest.raises(InvalidMessage) as info:
        decode_event(body, sig=sig, limits=limits)
    assert info.value.reason in REJECT_REASONS
    assert isinstance(info.value, BadInput)
    return info.value


# -- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("ev", EXAMPLES, ids=lambda ev: type(ev).__name__)
def test_every_event_round_trips(ev: QueueEvent) -> None:
    data = encode_event(ev)
    assert decode_event(data, sig=None, limits=LIMITS) == ev
    assert json.loads(data)["v"] == 1


def test_wire_form_is_tagged_and_plain_json() -> None:
    doc = raw(task_finished())
    assert doc["type"] == "task_finished"
    assert doc["files"][0] == {
        "path": "date=2024-01-01/part-00007-1b2c.snappy.parquet",
        "size": 123456,
        "md5": "a" * 32,
    }


def test_optional_fields_may_be_left_out_by_producers() -> None:
    doc = raw(task_finished())
    del doc["watermarks"], doc["v"]
    for f in doc["files"]:
        f.pop("md5", None)
    ev = decode_event(json.dumps(doc).encode(), sig=None, limits=LIMITS)
    assert isinstance(ev, TaskFinished)
    assert ev.v == 1 and ev.watermarks == {} and all(f.md5 is None for f in ev.files)


def test_events_are_frozen() -> None:
    ev = task_finished()
    with pytest.raises(AttributeError):
        ev.task = 3  # type: ignore[misc]


def test_memoryview_and_bytearray_input_decode() -> None:
    data = encode_event(task_finished())
    assert decode_event(memoryview(data), sig=None, limits=LIMITS) == task_finished()
    assert decode_event(bytearray(data), sig=None, limits=LIMITS) == task_finished()  # type: ignore[arg-type]


# -- rejections, one per reason --------------------------------------------------------------------


def test_bad_json() -> None:
    err = reject(b'{"type": "task_finished", ')
    assert err.reason == "bad_json"
    assert reject(b"\xff\xfe").reason == "bad_json"


def test_not_an_object() -> None:
    err = reject(b"[1, 2]")
    assert (err.reason, err.detail) == ("schema", "Expected `object`, got `array`")


def test_unknown_type() -> None:
    err = reject({"type": "job_paused", "v": 1, "job": "j1"})
    assert err.reason == "unknown_type"
    assert "'job_paused'" in err.detail and "$.type" in err.detail


def test_missing_type_is_schema() -> None:
    err = reject({"v": 1, "job": "j1"})
    assert err.reason == "schema" and "`type`" in err.detail


@pytest.mark.parametrize("v", [0, 2, 99])
def test_unsupported_version(v: int) -> None:
    doc = raw(task_finished()) | {"v": v}
    err = reject(doc)
    assert (err.reason, err.detail) == (
        "unsupported_version",
        f"version {v} is not supported (this consumer reads v1)",
    )


def test_unsupported_version_wins_over_unknown_fields() -> None:
    # A v2 producer may add fields; the consumer must say "version", not "schema".
    doc = raw(task_finished()) | {"v": 2, "new_field": [1]}
    assert reject(doc).reason == "unsupported_version"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"extra": 1}, "Object contains unknown field `extra`"),
        ({"task": "7"}, "Expected `int`, got `str` - at `$.task`"),
        ({"task": -1}, "Expected `int` >= 0 - at `$.task`"),
        ({"attempt": -2}, "Expected `int` >= 0 - at `$.attempt`"),
        ({"task": 2**31}, "Expected `int` <= 2147483647 - at `$.task`"),
        ({"task": True}, "Expected `int`, got `bool` - at `$.task`"),
        ({"finished_at": -1.0}, "Expected `float` >= 0.0 - at `$.finished_at`"),
        ({"files": [{"path": "a", "size": -5}]}, "Expected `int` >= 0 - at `$.files[0].size`"),
        ({"files": [{"path": "a", "size": 1, "md5": "ABC"}]}, "at `$.files[0].md5`"),
        ({"files": [{"path": "a"}]}, "Object missing required field `size` - at `$.files[0]`"),
        ({"files": [{"path": "a", "size": 1, "mode": 1}]}, "unknown field `mode` - at `$.files[0]`"),
        ({"watermarks": {"": 1}}, "Expected `str` of length >= 1 - at `key` in `$.watermarks`"),
        ({"watermarks": {"w": 2**63}}, "<= 9223372036854775807 - at `$.watermarks[...]`"),
        ({"v": "1"}, "Expected `int`, got `str` - at `$.v`"),
    ],
)
def test_schema_errors_name_the_field(change: dict[str, Any], expected: str) -> None:
    err = reject(raw(task_finished()) | change)
    assert err.reason == "schema"
    assert expected in err.detail


def test_number_out_of_range() -> None:
    data = encode_event(task_finished()).replace(b'"finished_at":1717171717.25', b'"finished_at":1e400')
    err = reject(data)
    assert (err.reason, err.detail) == ("schema", "Number out of range - at `$.finished_at`")
    assert reject(data.replace(b"1e400", b"Infinity")).reason == "bad_json"


def test_missing_required_field() -> None:
    doc = raw(task_finished())
    del doc["finished_at"]
    err = reject(doc)
    assert (err.reason, err.detail) == ("schema", "Object missing required field `finished_at`")


def test_oversized_is_rejected_before_parsing() -> None:
    limits = ValidationLimits(max_message_bytes=100)
    err = reject(b"x" * 101, limits)  # not even JSON: size is checked first
    assert (err.reason, err.detail) == ("oversized", "message is 101 bytes, the limit is 100")
    ok = encode_event(JobFailed(job="j", datasets=["d"], reason="", failed_at=0))
    assert len(ok) <= 100
    assert decode_event(ok, sig=None, limits=limits).job == "j"


@pytest.mark.parametrize("job", ["", "-x", "_x", ".x", "a/b", "..", "a b", "j\n", "é", "x" * 129])
def test_bad_job(job: str) -> None:
    err = reject(raw(task_finished()) | {"job": job})
    assert err.reason == "bad_job"
    assert repr(job) in err.detail and "$.job" in err.detail


def test_longest_job_is_accepted() -> None:
    ev = task_finished(job="j" * 128)
    assert decode_event(encode_event(ev), sig=None, limits=LIMITS) == ev


@pytest.mark.parametrize("dataset", ["", "_wal", ".cf", "a/b", "..", "a\\b", "sales\n", "x" * 129])
def test_bad_dataset_in_task_finished(dataset: str) -> None:
    err = reject(raw(task_finished()) | {"dataset": dataset})
    assert err.reason == "bad_dataset"
    assert "$.dataset" in err.detail


def test_bad_dataset_in_lists_names_the_index() -> None:
    err = reject(raw(EXAMPLES[0]) | {"datasets": ["sales", "../etc"]})
    assert err.reason == "bad_dataset" and "$.datasets[1]" in err.detail
    err = reject(raw(EXAMPLES[3]) | {"datasets": {"_state": {"tasks": 1}}})
    assert err.reason == "bad_dataset"


def test_configured_dataset_pattern_applies() -> None:
    strict = ValidationLimits(dataset_pattern=r"^[a-z]+$")
    assert decode_event(encode_event(task_finished()), sig=None, limits=strict) == task_finished()
    err = reject(raw(task_finished()) | {"dataset": "Sales"}, strict)
    assert err.reason == "bad_dataset" and "^[a-z]+$" in err.detail


def test_permissive_pattern_cannot_unlock_reserved_names() -> None:
    loose = ValidationLimits(dataset_pattern=r".*")
    for name in ["_wal", "a/b", "..", ".cf"]:
        assert reject(raw(task_finished()) | {"dataset": name}, loose).reason == "bad_dataset"


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../other/x", "'..'"),
        ("a/../../x", "'..'"),
        ("a//b", "empty, '.' or '..'"),
        ("./a", "'.'"),
        ("a/", "empty"),
        ("a\\b", "backslash"),
        ("a\x00b", "control"),
        ("a\nb", "control"),
        ("a\x7fb", "control"),
        ("_commits/x.json", "reserved"),
        ("x" * 256, "over 255 bytes"),
    ],
)
def test_unsafe_paths(path: str, why: str) -> None:
    doc = raw(task_finished()) | {"files": [{"path": "ok.parquet", "size": 1}, {"path": path, "size": 1}]}
    err = reject(doc)
    assert err.reason == "unsafe_path"
    assert why in err.detail and "$.files[1].path" in err.detail


def test_path_leading_to_overlong_keys_is_rejected() -> None:
    deep = "/".join(["d" * 200] * 5) + "/f"
    err = reject(raw(task_finished()) | {"files": [{"path": deep, "size": 1}]})
    assert err.reason == "unsafe_path" and "over 1024 bytes" in err.detail


def test_basename_too_long_once_prefixed_is_rejected() -> None:
    name = "p" * 250  # fits a file system, but not once '<job>~<task>-' is prepended
    err = reject(raw(task_finished()) | {"files": [{"path": name, "size": 1}]})
    assert err.reason == "unsafe_path" and "over 255 bytes" in err.detail


def test_underscore_file_and_nested_folder_are_fine() -> None:
    ev = task_finished(files=[StagedFile(path="_SUCCESS", size=0), StagedFile(path="a/_tmp/x", size=1)])
    assert decode_event(encode_event(ev), sig=None, limits=LIMITS) == ev


@pytest.mark.parametrize(
    ("ev", "detail"),
    [
        (JobStarted(job="j", datasets=[], timeout_s=1, started_at=0), "names no dataset"),
        (
            JobFailed(job="j", datasets=["a", "a"], reason="", failed_at=0),
            "listed twice - at `$.datasets[1]`",
        ),
        (JobFinished(job="j", datasets={}, finished_at=0), "names no dataset"),
        (
            JobFinished(job="j", datasets={"a": DatasetExpectation(tasks=3, winners=[0, 1])}, finished_at=0),
            "expects 3 tasks but names 2 winners",
        ),
        (
            task_finished(files=[StagedFile(path="a", size=1), StagedFile(path="a", size=2)]),
            "'a' is listed twice - at `$.files[1].path`",
        ),
    ],
)
def test_inconsistent(ev: QueueEvent, detail: str) -> None:
    err = reject(encode_event(ev))
    assert err.reason == "inconsistent" and detail in err.detail


def test_timeout_must_be_positive() -> None:
    err = reject(raw(EXAMPLES[0]) | {"timeout_s": 0})
    assert err.reason == "schema" and "$.timeout_s" in err.detail


def test_task_index_against_expectation() -> None:
    ev = task_finished(task=3)
    check_task_index(ev, DatasetExpectation(tasks=4))
    with pytest.raises(InvalidMessage) as info:
        check_task_index(ev, DatasetExpectation(tasks=3))
    assert info.value.reason == "inconsistent"
    assert "task 3 of dataset 'sales' is outside the job's 3 tasks" in info.value.detail


def test_invalid_message_pickles_with_reason() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(InvalidMessage("unsafe_path", "x")))
    assert (err.reason, err.detail, str(err)) == ("unsafe_path", "x", "unsafe_path: x")
    with pytest.raises(ValueError, match="unknown reject reason"):
        InvalidMessage("nope", "x")  # type: ignore[arg-type]


# -- signing ---------------------------------------------------------------------------------------


def test_signature_is_hmac_sha256_of_the_data_bytes() -> None:
    fields = entry_fields(task_finished(), secret=SECRET)
    expected = hmac.new(SECRET, fields["data"], hashlib.sha256).hexdigest().encode()
    assert fields["sig"] == expected == sign(fields["data"], SECRET)
    assert decode_entry(fields, limits=SIGNED) == task_finished()


def test_documented_signing_example() -> None:
    # The same example is in docs/contract.md (checked there with openssl); a JVM producer can test
    # its signer against it.
    data = (
        b'{"type":"job_failed","v":1,"job":"j1","datasets":["sales"],"reason":"oom","failed_at":1717171800.0}'
    )
    sig = b"4a1e1d88db2818c4d9aac4defc4027bcc6e89be493ed91aa51ec157050625a2f"
    assert sign(data, b"s3cret") == sig
    assert decode_event(data, sig=sig, limits=SIGNED).job == "j1"


def test_unsigned_rejected_when_secret_configured() -> None:
    data = encode_event(task_finished())
    for sig in (None, b""):
        err = reject(data, SIGNED, sig=sig)
        assert (err.reason, err.detail) == ("unsigned", "message has no signature and signing is required")


def test_wrong_secret_and_tampering_are_rejected() -> None:
    data = encode_event(task_finished())
    assert reject(data, SIGNED, sig=sign(data, b"other")).reason == "bad_signature"
    tampered = data.replace(b'"task":7', b'"task":8')
    assert tampered != data
    err = reject(tampered, SIGNED, sig=sign(data, SECRET))
    assert (err.reason, err.detail) == ("bad_signature", "message signature does not match its data")
    assert reject(data, SIGNED, sig=b"zz" * 32).reason == "bad_signature"
    assert reject(data, SIGNED, sig=sign(data, SECRET)[:-1]).reason == "bad_signature"


def test_signature_hex_case_and_str_are_accepted() -> None:
    data = encode_event(task_finished())
    good = sign(data, SECRET)
    assert decode_event(data, sig=good.upper(), limits=SIGNED) == task_finished()
    assert decode_event(data, sig=good.decode(), limits=SIGNED) == task_finished()
    assert reject(data, SIGNED, sig="é" * 64).reason == "bad_signature"  # type: ignore[arg-type]


def test_signature_checked_before_parsing() -> None:
    # Unsigned garbage must not reach the parser when signing is on.
    assert reject(b"not json", SIGNED).reason == "unsigned"


def test_signature_ignored_when_signing_off() -> None:
    data = encode_event(task_finished())
    assert decode_event(data, sig=b"garbage", limits=LIMITS) == task_finished()


def test_limits_from_settings() -> None:
    limits = ValidationLimits.from_settings(SecuritySettings())
    assert limits.secret is None and limits.max_message_bytes == 1_048_576
    limits = ValidationLimits.from_settings(
        SecuritySettings(hmac_secret="k", max_message_bytes=10, dataset_pattern="^a$")
    )
    assert (limits.secret, limits.max_message_bytes, limits.dataset_pattern) == (b"k", 10, "^a$")
    assert "k" not in repr(limits)


def test_bad_limits_are_config_errors() -> None:
    from shared import ConfigError

    with pytest.raises(ConfigError, match="dataset_pattern"):
        ValidationLimits(dataset_pattern="[")
    with pytest.raises(ConfigError):
        ValidationLimits(max_message_bytes=0)
    with pytest.raises(ConfigError):
        ValidationLimits(secret=b"")


# -- stream entries --------------------------------------------------------------------------------


def test_entry_fields_and_decode_entry_with_bytes_or_str_keys() -> None:
    ev = task_finished()
    fields = entry_fields(ev)
    assert set(fields) == {"data"}
    as_bytes = {k.encode(): v for k, v in fields.items()}
    assert decode_entry(as_bytes, limits=LIMITS) == ev
    as_str = {k: v.decode() for k, v in entry_fields(ev, secret=SECRET).items()}
    assert decode_entry(as_str, limits=SIGNED) == ev  # type: ignore[arg-type]
    assert decode_entry({b"data": fields["data"], b"trace": b"x"}, limits=LIMITS) == ev


def test_entry_without_data() -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_entry({b"payload": b"{}"}, limits=LIMITS)
    assert (info.value.reason, info.value.detail) == ("schema", "stream entry has no 'data' field")


# -- hostile input never escapes as anything but InvalidMessage ------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
near_events = st.sampled_from([raw(ev) for ev in EXAMPLES]).flatmap(
    lambda doc: st.dictionaries(st.sampled_from([*sorted(doc), "x"]), json_values, max_size=3).map(
        lambda patch: doc | patch
    )
)


def outcome(data: bytes) -> QueueEvent | InvalidMessage:
    try:
        return decode_event(data, sig=None, limits=LIMITS)
    except InvalidMessage as exc:
        return exc


@settings(max_examples=300, deadline=None)
@given(doc=json_values | near_events)
def test_random_json_is_decoded_or_rejected(doc: Any) -> None:
    result = outcome(json.dumps(doc).encode())
    if isinstance(result, InvalidMessage):
        assert result.reason in REJECT_REASONS and result.detail
    else:  # accepted means re-encodable and stable
        assert decode_event(encode_event(result), sig=None, limits=LIMITS) == result


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_are_rejected_cleanly(data: bytes) -> None:
    result = outcome(data)
    assert isinstance(result, InvalidMessage) and result.reason in REJECT_REASONS


def test_deep_nesting_is_rejected_cleanly() -> None:
    assert reject(b"[" * 100_000 + b"]" * 100_000).reason == "schema"
    deep = b'{"type":"zzz","v":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert reject(deep).reason in {"schema", "unknown_type"}


def test_msgspec_encoding_is_deterministic() -> None:
    ev = task_finished()
    assert encode_event(ev) == encode_event(msgspec.json.decode(encode_event(ev), type=TaskFinished))


def test_accepted_names_memo_never_admits_a_bad_name() -> None:
    limits = ValidationLimits(dataset_pattern=r"^[a-z]+$")
    good = encode_event(task_finished())
    bad = json.dumps(raw(task_finished()) | {"dataset": "Sales", "job": "-j"}).encode()
    for _ in range(3):
        assert decode_event(good, sig=None, limits=limits) == task_finished()
        with pytest.raises(InvalidMessage) as info:
            decode_event(bad, sig=None, limits=limits)
        assert info.value.reason == "bad_job"
    # The memo is per limits object: a stricter fleet does not inherit another's accepted names.
    stricter = ValidationLimits(dataset_pattern=r"^x$")
    assert reject(good, stricter).reason == "bad_dataset"


def test_details_stay_short_for_huge_values() -> None:
    huge = "/" + "a" * 500_000
    err = reject(raw(task_finished()) | {"files": [{"path": huge, "size": 1}]})
    assert err.reason == "unsafe_path"
    assert len(err.detail) < 400 and "(500001 characters)" in err.detail and "$.files[0].path" in err.detail
    err = reject(raw(task_finished()) | {"x" * 100_000: 1})  # msgspec's own message names the field
    assert err.reason == "schema" and len(err.detail) <= 1000
    assert len(InvalidMessage("schema", "d" * 5000).detail) == 1000
