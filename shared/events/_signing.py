"""HMAC-SHA256 message signing, versions 1 and 2, and signed operator requests.

The rules (docs/contract.md section 5), chosen so that any producer (Python,
Scala, Java, redis-cli plus openssl) reproduces them without canonical JSON.
The key is always the UTF-8 bytes of the shared secret; hex digits are
accepted in either case (some producers' encoders write upper-case).

- v1 (data only): ``sig`` = hex HMAC of the ``data`` bytes. Proves who wrote
  an entry, not where or when: readable while ``security.accept_v1`` is on.
- v2: ``sig`` = ``t=<ms>,v2=<hex>`` where ``<ms>`` is the signing time in
  Unix milliseconds (decimal) and ``<hex>`` the HMAC of::

      commitfleet/v2 LF <fleet> LF <stream key> LF <ms> LF <data bytes>

  so an entry captured from one fleet or stream does not verify in another,
  and one whose arrival in the stream (its entry id's time) is more than
  ``security.signature_max_age`` seconds from ``<ms>`` is rejected ``stale``.
- Operator requests (retry / skip): the value of the request's hash field is
  ``<op>;t=<ms>;v2=<hex>``, the HMAC of
  ``commitfleet/op/v2 LF <fleet> LF <dataset>/<job> LF <op> LF <ms>``;
  the worker that acts on it verifies it (same window, against its clock).

Consumers verify the bytes they received, before parsing them; a bad
signature is checked before the time, so garbage is ``bad_signature``, never
``stale``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from dataclasses import dataclass, field
from typing import Final

from ._invalid import InvalidMessage

_V2_TAG: Final = b"commitfleet/v2"
_OP_TAG: Final = b"commitfleet/op/v2"
_V2_SIG: Final = re.compile(rb"t=([0-9]{1,16}),v2=([0-9a-fA-F]{64})")
_OP_VALUE: Final = re.compile(r"([a-z]{1,16});t=([0-9]{1,16});v2=([0-9a-fA-F]{64})")


def sign(data: bytes, secret: bytes) -> bytes:
    """Return the v1 signature: lowercase hex HMAC-SHA256 of ``data`` keyed with ``secret``, as ASCII."""
    return hmac.new(secret, data, hashlib.sha256).hexdigest().encode("ascii")


def _as_bytes(sig: bytes | str | None) -> bytes:
    if not sig:
        raise InvalidMessage("unsigned", "message has no signature and signing is required")
    if isinstance(sig, str):
        return sig.encode("ascii", "replace")
    if isinstance(sig, bytes | bytearray | memoryview):
        return bytes(sig)
    # not from Redis (it only returns bytes), but never let it raise TypeError
    raise InvalidMessage("bad_signature", f"message signature is a {type(sig).__name__}, not hex text")


def _same(expected: bytes, given: bytes) -> bool:
    return hmac.compare_digest(expected, given) or hmac.compare_digest(expected, given.lower())


def verify(data: bytes, sig: bytes | str | None, secret: bytes) -> None:
    """Return when ``sig`` is the v1 signature of ``data`` under ``secret``.

    Hex digits are accepted in either case; the comparison takes constant time.

    Raises:
        InvalidMessage: ``unsigned`` when ``sig`` is missing or empty,
            ``bad_signature`` when it does not match.
    """
    if not _same(sign(data, secret), _as_bytes(sig)):
        raise InvalidMessage("bad_signature", "message signature does not match its data")


def signing_input_v2(fleet: str, stream: str, ts_ms: int, data: bytes) -> bytes:
    """Return the bytes a v2 signature is the HMAC of (see the module doc)."""
    head = b"\n".join((_V2_TAG, fleet.encode(), stream.encode(), str(ts_ms).encode("ascii")))
    return head + b"\n" + data


def sign_v2(data: bytes, secret: bytes, *, fleet: str, stream: str, ts_ms: int | None = None) -> bytes:
    """Return the v2 ``sig`` value, ``t=<ms>,v2=<hex>`` (``ts_ms`` defaults to now), as ASCII bytes."""
    ts = time.time_ns() // 1_000_000 if ts_ms is None else ts_ms
    mac = hmac.new(secret, signing_input_v2(fleet, stream, ts, data), hashlib.sha256).hexdigest()
    return b"t=%d,v2=%s" % (ts, mac.encode("ascii"))


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """What a consumer needs to verify signatures: the key, its fleet and the rules of the transition.

    ``max_age`` is in seconds; ``accept_v1`` False rejects v1 signatures.
    """

    secret: bytes = field(repr=False)
    fleet: str
    max_age: float = 300.0
    accept_v1: bool = True


def verify_entry(
    data: bytes, sig: bytes | str | None, check: SignatureCheck, *, stream: str, received_ms: int | None
) -> None:
    """Return when ``sig`` is a valid v2 (or, while accepted, v1) signature of ``data`` on ``stream``.

    ``received_ms`` is when the entry reached the stream (its entry id's
    time, Redis's clock); None means now.

    Raises:
        InvalidMessage: ``unsigned``, ``bad_signature`` (no match, wrong
            fleet or stream, or v1 after the transition) or ``stale`` (a valid
            v2 signature made more than ``check.max_age`` seconds from
            ``received_ms``, either way).
    """
    given = _as_bytes(sig)
    m = _V2_SIG.fullmatch(given)
    if m is None:
        if not check.accept_v1:
            raise InvalidMessage(
                "bad_signature", "not a v2 signature (v1 is no longer accepted: security.accept_v1)"
            )
        verify(data, given, check.secret)
        return
    ts = int(m.group(1))
    expected = hmac.new(
        check.secret, signing_input_v2(check.fleet, stream, ts, data), hashlib.sha256
    ).hexdigest()
    if not _same(expected.encode("ascii"), m.group(2)):
        raise InvalidMessage("bad_signature", "message signature does not match its data, fleet and stream")
    arrived = time.time_ns() // 1_000_000 if received_ms is None else received_ms
    if abs(arrived - ts) > check.max_age * 1000:
        raise InvalidMessage(
            "stale",
            f"signed at {ts} ms, arrived at {arrived} ms: more than {check.max_age:g}s apart "
            "(security.signature_max_age)",
        )


def _op_input(fleet: str, dataset: str, job: str, op: str, ts_ms: int) -> bytes:
    return b"\n".join((_OP_TAG, fleet.encode(), f"{dataset}/{job}".encode(), op.encode(), b"%d" % ts_ms))


def sign_operator_request(
    op: str, secret: bytes, *, fleet: str, dataset: str, job: str, ts_ms: int | None = None
) -> str:
    """Return the signed value of an operator request, ``<op>;t=<ms>;v2=<hex>``."""
    ts = time.time_ns() // 1_000_000 if ts_ms is None else ts_ms
    mac = hmac.new(secret, _op_input(fleet, dataset, job, op, ts), hashlib.sha256).hexdigest()
    return f"{op};t={ts};v2={mac}"


def operator_request_value(op: str, secret: bytes | None, *, fleet: str, dataset: str, job: str) -> str:
    """Return what to store for an operator request: signed with a ``secret``, else ``op`` alone."""
    if secret is None:
        return op
    return sign_operator_request(op, secret, fleet=fleet, dataset=dataset, job=job)


def verify_operator_request(
    value: str,
    check: SignatureCheck | None,
    *,
    dataset: str,
    job: str,
    now_ms: int | None = None,
) -> str:
    """Return the operation (``retry``, ``skip``) of a stored operator request once it verifies.

    With ``check`` None (signing off) a plain ``<op>`` is accepted, and a
    signed value's operation is returned unchecked. A plain ``<op>`` (what
    a v1 CLI writes) is also accepted while ``check.accept_v1`` is on.

    Raises:
        InvalidMessage: ``unsigned`` (signing is on, the value is a bare op),
            ``bad_signature``, or ``stale`` (signed more than ``check.max_age``
            seconds from ``now_ms``).
    """
    m = _OP_VALUE.fullmatch(value)
    if check is None:
        return m.group(1) if m else value
    if m is None:
        if ";" not in value and check.accept_v1:
            return value
        if ";" not in value:
            raise InvalidMessage("unsigned", "operator request is not signed and signing is required")
        raise InvalidMessage("bad_signature", "operator request is not <op>;t=<ms>;v2=<hex>")
    op, ts = m.group(1), int(m.group(2))
    expected = hmac.new(
        check.secret, _op_input(check.fleet, dataset, job, op, ts), hashlib.sha256
    ).hexdigest()
    if not _same(expected.encode("ascii"), m.group(3).encode("ascii")):
        raise InvalidMessage("bad_signature", "operator request signature does not match")
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if abs(now - ts) > check.max_age * 1000:
        raise InvalidMessage("stale", f"operator request signed {abs(now - ts) / 1000:.0f}s from now")
    return op
