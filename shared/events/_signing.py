"""Optional HMAC-SHA256 message signing.

The rule, chosen so that any producer (Python, Scala, Java, redis-cli plus
openssl) reproduces it exactly without canonical JSON: a stream entry has a
field ``data`` holding the event's JSON bytes as sent, and a field ``sig``
holding the hex HMAC-SHA256 of exactly those bytes (lowercase as we send it;
upper-case is accepted too, since some producers' hex encoders write it),
keyed with the UTF-8 bytes of the shared secret. The consumer verifies the
bytes it received, before parsing them.
"""

from __future__ import annotations

import hashlib
import hmac

from ._invalid import InvalidMessage


def sign(data: bytes, secret: bytes) -> bytes:
    """Return the lowercase hex HMAC-SHA256 of ``data`` keyed with ``secret``, as ASCII bytes."""
    return hmac.new(secret, data, hashlib.sha256).hexdigest().encode("ascii")


def verify(data: bytes, sig: bytes | str | None, secret: bytes) -> None:
    """Return when ``sig`` is the signature of ``data`` under ``secret``.

    Hex digits are accepted in either case; the comparison takes constant time.

    Raises:
        InvalidMessage: ``unsigned`` when ``sig`` is missing or empty,
            ``bad_signature`` when it does not match.
    """
    if not sig:
        raise InvalidMessage("unsigned", "message has no signature and signing is required")
    if isinstance(sig, str):
        given = sig.encode("ascii", "replace")
    elif isinstance(sig, bytes | bytearray | memoryview):
        given = bytes(sig)
    else:  # not from Redis (it only returns bytes), but never let it raise TypeError
        raise InvalidMessage("bad_signature", f"message signature is a {type(sig).__name__}, not hex text")
    expected = sign(data, secret)
    if not (hmac.compare_digest(expected, given) or hmac.compare_digest(expected, given.lower())):
        raise InvalidMessage("bad_signature", "message signature does not match its data")
