"""Hostile stream entries for fuzzing the intake boundary: valid messages, mutated.

Everything is drawn from one ``random.Random``, so a failing case is
reproduced from its seed (hypothesis drives the seed in unit tests; the fleet
fuzz test uses a fixed one). Each entry is a list of stream fields (name,
value), as ``XADD`` would store it: a name may occur more than once
(:data:`REPEATS`), which the contract rejects (``schema``).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from shared.events import sign

# Bytes that are never valid UTF-8 where they stand: a lone continuation byte,
# a truncated two- and three-byte sequence, an encoded surrogate, a code point
# above U+10FFFF, an overlong encoding, and bytes that never occur in UTF-8.
BAD_UTF8: tuple[bytes, ...] = (
    b"\x80",
    b"\xc3",
    b"\xe9",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xc0\xaf",
    b"\xff",
    b"\xfe\xfe",
)
ODD_VALUES: tuple[Any, ...] = (
    None,
    True,
    "",
    "x" * 300,
    -1,
    0,
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    1.5,
    -0.0,
    [],
    {},
    [1, "a", None],
    {"a": {"b": []}},
    "../../etc/passwd",
    "/abs/path",
    "_wal",
    "a\u0000b",
    "\u202e",
)
HUGE_NUMBERS: tuple[bytes, ...] = (
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"18446744073709551616",
    b"99999999999999999999999999999999999999",
    b"-9223372036854775809",
    b"2147483648",
    b"NaN",
    b"Infinity",
    b"0x10",
    b"01",
)


def base_messages(rng: random.Random, datasets: Sequence[str], foreign: str) -> list[dict[str, Any]]:
    """Return valid v1 events (as JSON documents) about ``datasets``; a few name ``foreign``."""
    ds = rng.choice(list(datasets))
    n = rng.randrange(1000)
    job = f"fz-{n}"
    now = 1_700_000_000.0 + rng.random()
    files = (
        [] if rng.random() < 0.5 else [{"path": f"date=2024-01-0{rng.randrange(1, 9)}/p-{n}.bin", "size": 3}]
    )
    docs: list[dict[str, Any]] = [
        {"type": "job_started", "v": 1, "job": job, "datasets": [ds], "timeout_s": 600, "started_at": now},
        {
            "type": "task_finished",
            "v": 1,
            "job": job,
            "dataset": ds,
            "task": rng.randrange(3),
            "attempt": rng.randrange(2),
            "files": files,
            "watermarks": {"kafka:t:0": rng.randrange(10**6)},
            "finished_at": now,
        },
        {
            "type": "job_finished",
            "v": 1,
            "job": job,
            "datasets": {ds: {"tasks": 1, "winners": [0]} if rng.random() < 0.5 else {"tasks": 2}},
            "finished_at": now,
        },
        {"type": "job_failed", "v": 1, "job": job, "datasets": [ds], "reason": "boom é", "failed_at": now},
        {"type": "job_cancelled", "v": 1, "job": job, "datasets": [ds], "reason": "", "cancelled_at": now},
    ]
    if rng.random() < 0.1:
        docs.append(
            {
                "type": "job_failed",
                "v": 1,
                "job": job,
                "datasets": [ds, foreign],
                "reason": "x",
                "failed_at": now,
            }
        )
    return docs


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _delete(rng: random.Random, doc: dict[str, Any]) -> bytes:
    path = rng.choice(_paths(doc))
    parent = _get(doc, path[:-1])
    del parent[path[-1]]
    return json.dumps(doc).encode()


def _swap(rng: random.Random, doc: dict[str, Any]) -> bytes:
    path = rng.choice(_paths(doc))
    _get(doc, path[:-1])[path[-1]] = rng.choice(ODD_VALUES)
    return json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode()


def _extra(rng: random.Random, doc: dict[str, Any]) -> bytes:
    targets = [p for p in _paths(doc) if isinstance(_get(doc, p), dict)] + [()]
    target = _get(doc, rng.choice(targets))
    target[rng.choice(["extra", "type", "v", "job", "datasets", "files", "é"])] = rng.choice(ODD_VALUES)
    return json.dumps(doc).encode()


def _bad_utf8(rng: random.Random, doc: dict[str, Any]) -> bytes:
    raw = json.dumps(doc, ensure_ascii=False).encode()
    quotes = [i for i, b in enumerate(raw) if b == ord('"')]
    at = rng.choice(quotes) + 1 if quotes else 0
    return raw[:at] + rng.choice(BAD_UTF8) + raw[at:]


def _flip(rng: random.Random, doc: dict[str, Any]) -> bytes:
    raw = bytearray(json.dumps(doc).encode())
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(raw))
        raw[i] = rng.randrange(256) if rng.random() < 0.5 else raw[i] ^ (1 << rng.randrange(8))
    return bytes(raw)


def _huge(rng: random.Random, doc: dict[str, Any]) -> bytes:
    nums = [
        p for p in _paths(doc) if isinstance(_get(doc, p), int | float) and not isinstance(_get(doc, p), bool)
    ]
    if not nums:
        return json.dumps(doc).encode()
    path = rng.choice(nums)
    marker = "__HUGE__"
    _get(doc, path[:-1])[path[-1]] = marker
    return json.dumps(doc).encode().replace(b'"__HUGE__"', rng.choice(HUGE_NUMBERS))


def _escapes(rng: random.Random, doc: dict[str, Any]) -> bytes:
    strings = [p for p in _paths(doc) if isinstance(_get(doc, p), str)]
    if not strings:
        return json.dumps(doc).encode()
    path = rng.choice(strings)
    _get(doc, path[:-1])[path[-1]] = "__ESC__"
    esc = rng.choice([b"\\ud800", b"\\udc00x", b"\\u0000", b"\\uffff", b"\\ud83d\\ude00", b"\\x41", b"\\"])
    return json.dumps(doc).encode().replace(b"__ESC__", esc)


def _duplicate_key(rng: random.Random, doc: dict[str, Any]) -> bytes:
    key = rng.choice(list(doc))
    raw = json.dumps(doc).encode()
    return (
        raw[:-1]
        + b", "
        + json.dumps(key).encode()
        + b": "
        + json.dumps(rng.choice(ODD_VALUES)).encode()
        + b"}"
    )


def _truncate(rng: random.Random, doc: dict[str, Any]) -> bytes:
    raw = json.dumps(doc).encode()
    return raw[: rng.randrange(len(raw))]


def _nest(rng: random.Random, doc: dict[str, Any]) -> bytes:
    depth = rng.choice([10, 1000, 100_000])
    return json.dumps(doc).encode()[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"


def _random_bytes(rng: random.Random, doc: dict[str, Any]) -> bytes:
    return rng.randbytes(rng.randrange(0, 200))


def _unchanged(rng: random.Random, doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


MUTATIONS: dict[str, Callable[[random.Random, dict[str, Any]], bytes]] = {
    "unchanged": _unchanged,
    "flip": _flip,
    "bad_utf8": _bad_utf8,
    "delete": _delete,
    "swap": _swap,
    "extra": _extra,
    "huge": _huge,
    "escapes": _escapes,
    "duplicate_key": _duplicate_key,
    "truncate": _truncate,
    "nest": _nest,
    "random_bytes": _random_bytes,
}


# How an entry repeats a field name: the event's data (another message's, or the same bytes
# again), the signature, a field nobody reads.
REPEATS: tuple[str, ...] = ("data", "same_data", "sig", "unknown")
REPEAT_RATE = 0.06


def _repeat(rng: random.Random, pairs: list[tuple[bytes, bytes]], other_data: bytes) -> None:
    """Make one field name of ``pairs`` occur more than once (:data:`REPEATS` says which), each
    added field at a random place."""
    how = rng.choice(REPEATS)
    present = dict(pairs)
    name = {"data": b"data", "same_data": b"data", "sig": b"sig"}.get(how) or rng.choice(
        [b"trace", b"\xff\xfe", b"Data", b""]
    )
    if how == "data":
        value = other_data
    elif how == "same_data":
        value = present.get(name, other_data)
    elif how == "sig":
        value = rng.choice([present.get(name, b""), rng.randbytes(8), b"zz"])
    else:
        value = rng.randbytes(4)
    for _ in range(1 if name in present else 2):
        pairs.insert(rng.randrange(len(pairs) + 1), (name, value))


def hostile_entry(
    rng: random.Random, datasets: Sequence[str], foreign: str, secret: bytes | None
) -> tuple[str, list[tuple[bytes, bytes]]]:
    """Return (mutation name, stream fields as sent) of one hostile or valid entry."""
    doc = rng.choice(base_messages(rng, datasets, foreign))
    kind = rng.choice(list(MUTATIONS))
    data = MUTATIONS[kind](rng, doc)
    fields: dict[bytes, bytes] = {}
    roll = rng.random()
    if roll < 0.04:
        fields[rng.choice([b"DATA", b"data ", b"payload", b"\xff\xfe", b""])] = data  # no `data` field
    else:
        fields[b"data"] = data
    if roll > 0.95:
        for i in range(rng.randrange(1, 40)):
            fields[f"trace{i}".encode() + rng.randbytes(2)] = rng.randbytes(rng.randrange(20))
    if secret is not None:
        sig = sign(data, secret)
        r = rng.random()
        if r < 0.05:
            pass  # unsigned
        elif r < 0.1:
            fields[b"sig"] = rng.choice([b"", b"zz", rng.randbytes(64), sig[:-1], b"\xe9" * 64])
        elif r < 0.2:
            fields[b"sig"] = sig.upper()
        else:
            fields[b"sig"] = sig
    elif rng.random() < 0.05:
        fields[b"sig"] = rng.randbytes(8)  # ignored without a secret
    pairs = list(fields.items())
    if rng.random() < REPEAT_RATE:
        _repeat(
            rng,
            pairs,
            MUTATIONS[rng.choice(list(MUTATIONS))](rng, rng.choice(base_messages(rng, datasets, foreign))),
        )
    return kind, pairs


def repeated_names(pairs: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
    """Return the field names that occur more than once in ``pairs``."""
    counts = Counter(name for name, _ in pairs)
    return {name for name, n in counts.items() if n > 1}
