"""Encoding and decoding of queue and admin events (JSON, msgspec).

A queue message travels as one Redis stream entry with the field ``data``
(the event's JSON) and, when signing is on, ``sig`` (v2: ``t=<ms>,v2=<hex>``
over fleet, stream, time and data; v1: hex HMAC-SHA256 of the ``data`` bytes;
see :mod:`._signing`). Decoding is one msgspec pass into the
typed union; only a message that fails it is parsed a second time, to name
the precise reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar

import msgspec

from ._admin_events import ADMIN_EVENT_TYPES, AdminEvent
from ._invalid import InvalidMessage, shown
from ._queue_events import QUEUE_EVENT_TYPES, SCHEMA_VERSION, QueueEvent
from ._signing import sign, sign_v2, verify_entry
from ._validation import ValidationLimits, validate_event

DATA_FIELD: Final = "data"
"""Stream entry field holding the event's JSON bytes."""
SIG_FIELD: Final = "sig"
"""Stream entry field holding the signature (when signing is on)."""

_T = TypeVar("_T")


_ENCODER: Final = msgspec.json.Encoder()
_QUEUE_DECODER: Final[msgspec.json.Decoder[QueueEvent]] = msgspec.json.Decoder(QueueEvent)
_ADMIN_DECODER: Final[msgspec.json.Decoder[AdminEvent]] = msgspec.json.Decoder(AdminEvent)


def encode_event(ev: QueueEvent) -> bytes:
    """Return the JSON bytes of a queue event (compact, fields in declaration order).

    Encoding does not validate; call :func:`validate_event` first when the
    event comes from untrusted values.
    """
    return _ENCODER.encode(ev)


def entry_fields(
    ev: QueueEvent,
    *,
    secret: bytes | None = None,
    fleet: str | None = None,
    stream: str | None = None,
    ts_ms: int | None = None,
) -> dict[str, bytes]:
    """Return the stream entry fields of ``ev``: ``{"data": json}``, plus ``"sig"`` with a ``secret``.

    The signature is v2 (bound to ``fleet``, ``stream`` and ``ts_ms``, now by
    default) when ``fleet`` and ``stream`` are given, else v1 (data only).
    """
    data = _ENCODER.encode(ev)
    if secret is None:
        return {DATA_FIELD: data}
    if fleet is None or stream is None:
        return {DATA_FIELD: data, SIG_FIELD: sign(data, secret)}
    return {DATA_FIELD: data, SIG_FIELD: sign_v2(data, secret, fleet=fleet, stream=stream, ts_ms=ts_ms)}


class _Envelope(msgspec.Struct):
    """Just the fields that tell why a message did not decode; the rest is skipped."""

    type: Any = None
    v: Any = None


_ENVELOPE_DECODER: Final = msgspec.json.Decoder(_Envelope)


def _classify(
    data: bytes | memoryview, types: Mapping[str, type], exc: msgspec.ValidationError
) -> InvalidMessage:
    # Slow path, only for rejected messages: read the envelope to tell an
    # unknown type or version apart from an ordinary shape error.
    try:
        env = _ENVELOPE_DECODER.decode(data)
    except (msgspec.DecodeError, UnicodeError, RecursionError):
        return InvalidMessage("schema", str(exc))
    if isinstance(env.type, str) and env.type not in types:
        return InvalidMessage("unknown_type", f"unknown event type {shown(env.type)} - at `$.type`")
    v = SCHEMA_VERSION if env.v is None else env.v
    if isinstance(v, int) and not isinstance(v, bool) and v != SCHEMA_VERSION:
        return InvalidMessage(
            "unsupported_version", f"version {v} is not supported (this consumer reads v{SCHEMA_VERSION})"
        )
    return InvalidMessage("schema", str(exc))


def decode_event(
    data: bytes | memoryview,
    *,
    sig: bytes | str | None,
    limits: ValidationLimits,
    stream: str = "",
    received_ms: int | None = None,
) -> QueueEvent:
    """Return the queue event in ``data`` after checking size, signature, shape and contract rules.

    Order of checks: size (before anything is parsed), signature (when
    ``limits.secret`` is set; a v2 signature must name ``stream`` and be made
    within ``limits.signature_max_age`` of ``received_ms``, the entry's
    arrival, now when None), JSON and shape, then :func:`validate_event`.

    Raises:
        InvalidMessage: with ``reason`` ``oversized``, ``unsigned``,
            ``bad_signature``, ``stale``, ``bad_json``, ``unknown_type``,
            ``unsupported_version``, ``schema``, ``bad_job``, ``bad_dataset``,
            ``unsafe_path`` or ``inconsistent``.
    """
    size = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
    if size > limits.max_message_bytes:
        raise _oversized(size, limits)
    if limits.signing is not None:
        raw = data if isinstance(data, bytes) else bytes(data)
        verify_entry(raw, sig, limits.signing, stream=stream, received_ms=received_ms)
    return validate_event(_decode(_QUEUE_DECODER, QUEUE_EVENT_TYPES, data), limits)


def _oversized(size: int, limits: ValidationLimits) -> InvalidMessage:
    return InvalidMessage("oversized", f"message is {size} bytes, the limit is {limits.max_message_bytes}")


def _decode(decoder: msgspec.json.Decoder[_T], types: Mapping[str, type], data: bytes | memoryview) -> _T:
    """Return ``decoder.decode(data)``, every way that can fail mapped into InvalidMessage.

    msgspec raises ``UnicodeDecodeError`` (not its own DecodeError) for
    invalid UTF-8 inside a JSON string; that, like any malformed JSON, is
    ``bad_json``.
    """
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _classify(data, types, exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidMessage("bad_json", str(exc)) from None
    except UnicodeError as exc:
        raise InvalidMessage("bad_json", f"not valid UTF-8: {exc}") from None
    except RecursionError:  # cannot happen with these types today; never let it crash a shard
        raise InvalidMessage("schema", "message nests too deeply") from None


class RepeatedFields(dict[bytes, bytes]):
    """The fields of a stream entry in which a field name occurs more than once.

    ``XADD s * data A data B`` stores both fields, but a field map holds one
    value per name, and clients disagree on which one counts (redis-py keeps
    the last, others the first). Such an entry has no field map: this one is
    empty, so a lookup never finds one of the values, and :attr:`pairs` keeps
    every field as sent, in order. :func:`decode_entry` rejects it (``schema``,
    naming the field); ``shared.queue`` builds it wherever it reads entries.
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        super().__init__()
        self.pairs: tuple[tuple[bytes, bytes], ...] = tuple(pairs)
        """Every field of the entry as sent (name, value), repeats included, in order."""

    @property
    def repeated(self) -> dict[bytes, int]:
        """The names that occur more than once, each with how many times, in the order they first occur."""
        counts = Counter(name for name, _ in self.pairs)
        return {name: n for name, n in counts.items() if n > 1}

    def rejection(self) -> InvalidMessage:
        """Return why the entry is rejected: ``schema``, naming the repeated field(s)."""
        repeated = list(self.repeated.items())
        names = ", ".join(f"{shown(_text(name), 60)} ({n} times)" for name, n in repeated[:5])
        if len(repeated) > 5:
            names += f" and {len(repeated) - 5} more"
        noun = "field" if len(repeated) == 1 else "fields"
        return InvalidMessage(
            "schema", f"stream entry repeats the {noun} {names}: which value counts is ambiguous"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RepeatedFields) and other.pairs == self.pairs

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __repr__(self) -> str:
        return f"RepeatedFields({list(self.pairs)!r})"

    def __reduce__(self) -> tuple[type[RepeatedFields], tuple[tuple[tuple[bytes, bytes], ...]]]:
        return (RepeatedFields, (self.pairs,))


def _text(name: bytes | str) -> str:
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


_DATA_BYTES: Final = DATA_FIELD.encode()
_DATA_KEYS: Final = (_DATA_BYTES, DATA_FIELD)
_SIG_KEYS: Final = (SIG_FIELD.encode(), SIG_FIELD)


def _field(fields: Mapping[Any, Any], names: tuple[bytes, str]) -> Any:
    # bytes first: redis-py hands bytes names unless told to decode.
    value = fields.get(names[0])
    if value is None:
        value = fields.get(names[1])
    return value


def decode_entry(
    fields: Mapping[bytes, bytes] | Mapping[str, bytes],
    *,
    limits: ValidationLimits,
    stream: str = "",
    entry_id: bytes | str | None = None,
) -> QueueEvent:
    """Return the queue event of one stream entry (its ``data`` and ``sig`` fields; others are ignored).

    ``stream`` is the key the entry was read from and ``entry_id`` its id
    (whose time is the entry's arrival): both are checked against a v2
    signature (without an id, the arrival is taken as now).

    Field names and values may be ``bytes`` (redis-py default) or ``str``.
    Total: whatever the fields hold, this returns an event or raises
    InvalidMessage, never anything else.

    Raises:
        InvalidMessage: ``schema`` when the entry has no ``data`` field (or
            it is not bytes) or repeats a field name (``fields`` is a
            :class:`RepeatedFields`), else as :func:`decode_event`.
    """
    # _field(fields, _DATA_KEYS), its common case spelled out: this runs per event.
    data = fields.get(_DATA_BYTES)  # type: ignore[call-overload]
    if data is None:
        data = _field(fields, _DATA_KEYS)
    if type(data) is bytes and limits.signing is None:
        # The common case, kept short: intake spends a good part of its time here.
        # Without signing the ``sig`` field is ignored, so it is not even looked up.
        if len(data) > limits.max_message_bytes:
            raise _oversized(len(data), limits)
        try:  # _decode's call spelled out for the message that decodes
            ev = _QUEUE_DECODER.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeError, RecursionError):
            ev = _decode(_QUEUE_DECODER, QUEUE_EVENT_TYPES, data)  # raises it as InvalidMessage
        return validate_event(ev, limits)
    if data is None:
        if type(fields) is RepeatedFields:  # every field set aside: a name repeats
            raise fields.rejection()
        raise InvalidMessage("schema", f"stream entry has no {DATA_FIELD!r} field")
    if isinstance(data, str):
        try:
            data = data.encode()
        except UnicodeError:
            raise InvalidMessage("bad_json", "the data field is not valid UTF-8 text") from None
    elif isinstance(data, bytearray | memoryview):
        data = bytes(data)
    elif not isinstance(data, bytes):
        raise InvalidMessage("schema", f"the data field is a {type(data).__name__}, not bytes")
    sig = _field(fields, _SIG_KEYS)
    if sig is not None and not isinstance(sig, bytes | str):
        sig = repr(sig)  # never a valid signature: rejected as bad_signature when signing is on
    received = _id_ms(entry_id) if limits.signing is not None else None
    return decode_event(data, sig=sig, limits=limits, stream=stream, received_ms=received)


def _id_ms(entry_id: bytes | str | None) -> int | None:
    """Return the millisecond time of a stream entry id (``<ms>-<seq>``), None when absent or odd."""
    if entry_id is None:
        return None
    head = (entry_id.decode("ascii", "replace") if isinstance(entry_id, bytes) else entry_id).partition("-")[
        0
    ]
    return int(head) if head.isdigit() and len(head) <= 16 else None


def encode_admin(ev: AdminEvent) -> bytes:
    """Return the JSON bytes of an admin event."""
    return _ENCODER.encode(ev)


def decode_admin(data: bytes | memoryview) -> AdminEvent:
    """Return the admin event in ``data``.

    Raises:
        InvalidMessage: ``bad_json``, ``unknown_type`` (e.g. an event of a
            newer fleet: readers usually skip it), ``unsupported_version`` or
            ``schema``.
    """
    ev = _decode(_ADMIN_DECODER, ADMIN_EVENT_TYPES, data)
    if ev.v != SCHEMA_VERSION:
        raise InvalidMessage(
            "unsupported_version", f"version {ev.v} is not supported (this reader reads v{SCHEMA_VERSION})"
        )
    return ev
