"""Signing v2 (fleet, stream, time), v1 in the transition, signed operator requests, the doc's vectors."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from pathlib import Path

import pytest

from shared import load_settings
from shared.events import (
    InvalidMessage,
    JobFailed,
    SignatureCheck,
    ValidationLimits,
    decode_entry,
    decode_event,
    entry_fields,
    sign,
    sign_operator_request,
    sign_v2,
    verify_operator_request,
)
from shared.queue import Keys, plan_entries

DOC = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text(encoding="utf-8")
KEY = b"s3cret"
FLEET = "prod"
STREAM = "cf:prod:{s33}:events"
EV = JobFailed(job="j1", datasets=["sales"], reason="oom", failed_at=1717171800.0)


def limits(**kw: object) -> ValidationLimits:
    return ValidationLimits(secret=KEY, fleet=FLEET, **kw)  # type: ignore[arg-type]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def vectors() -> dict[str, str]:
    m = re.search(r"```text signing-vectors\n(.*?)```", DOC, flags=re.S)
    assert m is not None, "docs/contract.md has no signing-vectors block"
    out: dict[str, str] = {}
    for line in m.group(1).splitlines():
        name, value = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        out[name] = value
    return out


def test_the_vectors_in_the_contract_are_what_the_code_computes() -> None:
    v = vectors()
    key, data, ts = v["secret"].encode(), v["data"].encode(), int(v["t"])
    assert sign(data, key).decode() == v["v1 sig"]
    assert sign_v2(data, key, fleet=v["fleet"], stream=v["stream"], ts_ms=ts).decode() == v["v2 sig"]
    # The rule as the doc states it, computed without our helpers (what a Java producer does).
    message = b"\n".join(
        [b"commitfleet/v2", v["fleet"].encode(), v["stream"].encode(), v["t"].encode(), data]
    )
    assert v["v2 sig"] == f"t={ts},v2=" + hmac.new(key, message, hashlib.sha256).hexdigest()
    for op in ("retry", "skip"):
        made = sign_operator_request(
            op, key, fleet=v["fleet"], dataset=v["op dataset"], job=v["op job"], ts_ms=ts
        )
        assert made == v[f"{op} value"]
    # And the vectors verify, arriving within the window of their time.
    check = ValidationLimits(secret=key, fleet=v["fleet"])
    assert decode_event(data, sig=v["v2 sig"].encode(), limits=check, stream=v["stream"], received_ms=ts + 5)
    assert decode_event(data, sig=v["v1 sig"].encode(), limits=check, stream=v["stream"], received_ms=ts)
    assert v["data"] in DOC.split("```sh", 2)[2]  # the shell example signs the same bytes


def test_v2_round_trip_through_the_publisher_plan() -> None:
    keys = Keys(FLEET)
    ((shard, fields),) = plan_entries([EV], 64, secret=KEY, keys=keys)
    assert fields["sig"].startswith(b"t=") and b",v2=" in fields["sig"]
    assert decode_entry(fields, limits=limits(), stream=keys.events(shard)) == EV
    # Upper-case hex is accepted (some producers' encoders write it).
    t, _, mac = fields["sig"].partition(b",v2=")
    upper = {**fields, "sig": t + b",v2=" + mac.upper()}
    assert decode_entry(upper, limits=limits(), stream=keys.events(shard)) == EV


@pytest.mark.parametrize(
    ("fleet", "stream"),
    [("other", STREAM), (FLEET, "cf:prod:{s34}:events"), ("other", "cf:other:{s33}:events")],
)
def test_a_v2_entry_moved_to_another_fleet_or_stream_is_a_bad_signature(fleet: str, stream: str) -> None:
    fields = entry_fields(EV, secret=KEY, fleet=FLEET, stream=STREAM)
    other = ValidationLimits(secret=KEY, fleet=fleet)
    with pytest.raises(InvalidMessage) as info:
        decode_entry(fields, limits=other, stream=stream)
    assert info.value.reason == "bad_signature"


def test_tampered_data_time_or_key_is_a_bad_signature() -> None:
    fields = entry_fields(EV, secret=KEY, fleet=FLEET, stream=STREAM)
    tampered = [
        {**fields, "data": fields["data"].replace(b"oom", b"ok!")},
        {**fields, "sig": re.sub(rb"t=(\d+)", lambda m: b"t=%d" % (int(m.group(1)) + 1), fields["sig"])},
        entry_fields(EV, secret=b"wrong", fleet=FLEET, stream=STREAM),
        {**fields, "sig": b"t=1,v2=zz"},
    ]
    for bad in tampered:
        with pytest.raises(InvalidMessage) as info:
            decode_entry(bad, limits=limits(), stream=STREAM)
        assert info.value.reason == "bad_signature", bad
    with pytest.raises(InvalidMessage) as unsigned:
        decode_entry({"data": fields["data"]}, limits=limits(), stream=STREAM)
    assert unsigned.value.reason == "unsigned"


def test_stale_is_measured_against_the_entry_id_either_way() -> None:
    signed_at = now_ms() - 3_600_000  # an hour ago
    fields = entry_fields(EV, secret=KEY, fleet=FLEET, stream=STREAM, ts_ms=signed_at)
    # Added right after signing, read an hour later (workers were down): accepted.
    assert decode_entry(fields, limits=limits(), stream=STREAM, entry_id=f"{signed_at + 40}-0".encode()) == EV
    # The same bytes added again now (a replay): stale. Without an id, arrival is now: stale too.
    for entry_id in (f"{now_ms()}-3".encode(), None):
        with pytest.raises(InvalidMessage) as info:
            decode_entry(fields, limits=limits(), stream=STREAM, entry_id=entry_id)
        assert info.value.reason == "stale"
    # Signed far in the future of its arrival (a skewed clock): stale as well; the window is a setting.
    ahead = entry_fields(EV, secret=KEY, fleet=FLEET, stream=STREAM, ts_ms=now_ms() + 20_000)
    with pytest.raises(InvalidMessage) as future:
        decode_entry(ahead, limits=limits(signature_max_age=10.0), stream=STREAM)
    assert future.value.reason == "stale"
    assert decode_entry(ahead, limits=limits(signature_max_age=30.0), stream=STREAM) == EV
    # A forged signature is bad_signature, never stale.
    forged = {**fields, "sig": fields["sig"][:-4] + b"0000"}
    with pytest.raises(InvalidMessage) as bad:
        decode_entry(forged, limits=limits(), stream=STREAM, entry_id=f"{now_ms()}-0".encode())
    assert bad.value.reason == "bad_signature"


def test_v1_is_read_until_accept_v1_is_turned_off() -> None:
    v1 = entry_fields(EV, secret=KEY)
    assert decode_entry(v1, limits=limits(), stream=STREAM) == EV
    with pytest.raises(InvalidMessage) as info:
        decode_entry(v1, limits=limits(accept_v1=False), stream=STREAM)
    assert info.value.reason == "bad_signature" and "accept_v1" in info.value.detail
    s = load_settings(
        env={"COMMITFLEET_SECURITY_HMAC_SECRET": "planted-k3y", "COMMITFLEET_SECURITY_ACCEPT_V1": "false"}
    )
    from_settings = ValidationLimits.from_settings(s.security, fleet="f")
    assert from_settings.signing is not None and not from_settings.signing.accept_v1
    assert from_settings.signing.fleet == "f" and from_settings.signing.max_age == 300.0
    assert "planted-k3y" not in repr(from_settings) + repr(from_settings.signing)


def test_operator_requests_are_signed_and_checked() -> None:
    check = SignatureCheck(KEY, FLEET, 60.0, accept_v1=False)
    value = sign_operator_request("skip", KEY, fleet=FLEET, dataset="sales", job="j1")
    assert verify_operator_request(value, check, dataset="sales", job="j1") == "skip"
    cases = {
        "bad_signature": [
            value.replace("skip;", "retry;"),  # another operation
            sign_operator_request("skip", b"wrong", fleet=FLEET, dataset="sales", job="j1"),
            sign_operator_request("skip", KEY, fleet="other", dataset="sales", job="j1"),
            "skip;garbage",
        ],
        "unsigned": ["skip"],
        "stale": [
            sign_operator_request(
                "skip", KEY, fleet=FLEET, dataset="sales", job="j1", ts_ms=now_ms() - 61_000
            )
        ],
    }
    for reason, values in cases.items():
        for bad in values:
            with pytest.raises(InvalidMessage) as info:
                verify_operator_request(bad, check, dataset="sales", job="j1")
            assert info.value.reason == reason, bad
    with pytest.raises(InvalidMessage):  # the same request for another dataset
        verify_operator_request(value, check, dataset="orders", job="j1")
    # During the transition a bare op (an older CLI) is accepted; without signing, anything parses.
    transition = SignatureCheck(KEY, FLEET, 60.0, accept_v1=True)
    assert verify_operator_request("retry", transition, dataset="sales", job="j1") == "retry"
    assert verify_operator_request("retry", None, dataset="sales", job="j1") == "retry"
    assert verify_operator_request(value, None, dataset="sales", job="j1") == "skip"
