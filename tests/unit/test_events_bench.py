"""Decode + validate cost of a typical ~300-byte TaskFinished (pytest -m bench -s)."""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable

import msgspec
import pytest

from shared.events import (
    QueueEvent,
    StagedFile,
    TaskFinished,
    ValidationLimits,
    decode_event,
    encode_event,
    sign,
)

pytestmark = pytest.mark.bench

EV = TaskFinished(
    job="etl-20240601-0a1b2c",
    dataset="sales_orders",
    task=17,
    attempt=0,
    files=[
        StagedFile(
            path="date=2024-06-01/part-00017-6f1c2a7e-c000.snappy.parquet",
            size=1834211,
            md5="9e107d9d372bb6826bd81d3542a419d6",
        )
    ],
    watermarks={"kafka:orders:3": 88231455},
    finished_at=1717171717.25,
)


def per_call_us(fn: Callable[[], object], number: int = 50_000) -> float:
    # CPU time of this process, so other processes on a busy machine do not count.
    timer = timeit.Timer(fn, timer=time.process_time)
    return min(timer.repeat(number=number, repeat=7)) / number * 1e6


def test_decode_and_validate_cost() -> None:
    data = encode_event(EV)
    secret = b"k" * 32
    sig = sign(data, secret)
    plain, signed = ValidationLimits(), ValidationLimits(secret=secret)
    raw_decoder = msgspec.json.Decoder(QueueEvent)
    figures = {
        "msgspec decode only": per_call_us(lambda: raw_decoder.decode(data)),
        "decode_event": per_call_us(lambda: decode_event(data, sig=None, limits=plain)),
        "decode_event + HMAC": per_call_us(lambda: decode_event(data, sig=sig, limits=signed)),
    }
    print(f"\n{len(data)}-byte task_finished:")
    for name, us in figures.items():
        print(f"  {name:22s} {us:6.2f} us")
    # Generous bound: a loaded 2-core machine; the point is to catch an accidental slow path.
    assert figures["decode_event"] < 50
