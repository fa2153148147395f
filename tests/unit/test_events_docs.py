"""docs/contract.md stays true: its examples decode, its test vector and keys are right."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from shared.events import (
    JobStarted,
    ValidationLimits,
    decode_admin,
    decode_event,
    published_key,
    sign,
    staged_key,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```([^\n]*)\n(.*?)```", DOC, flags=re.S)


def test_every_queue_json_example_decodes() -> None:
    queue = [body for info, body in BLOCKS if info.strip() == "json"]
    assert len(queue) == 6  # one per event type, and a streaming job_started
    events = [decode_event(body.strip().encode(), sig=None, limits=ValidationLimits()) for body in queue]
    assert len({type(ev) for ev in events}) == 5
    assert [ev.stream.batch for ev in events if isinstance(ev, JobStarted) and ev.stream is not None] == [7]


def test_admin_example_decodes() -> None:
    # One event per line (a block may show several).
    blocks = [body for info, body in BLOCKS if info.strip() == "json admin"]
    admin = [line for body in blocks for line in body.splitlines() if line]
    assert len(admin) >= 3
    for line in admin:
        decode_admin(line.encode())


def test_shell_examples_carry_valid_events() -> None:
    shell = "\n".join(body for info, body in BLOCKS if info.strip() == "sh")
    unsigned = next(
        line for line in shell.splitlines() if line.startswith("redis-cli XADD") and "data '" in line
    )
    args = shlex.split(unsigned)
    assert args[:4] == ["redis-cli", "XADD", "$STREAM", "*"] and args[4] == "data"
    decode_event(args[5].encode(), sig=None, limits=ValidationLimits())
    data_line = next(line for line in shell.splitlines() if line.startswith("DATA="))
    data = shlex.split(data_line.removeprefix("DATA="))[0].encode()
    sig = re.search(r"`sig` = `([0-9a-f]{64})`", DOC)
    assert sig is not None
    assert sign(data, b"s3cret").decode() == sig.group(1)
    assert f"`{data.decode()}`" in DOC  # the test vector and the shell example are the same bytes
    decode_event(data, sig=sig.group(1).encode(), limits=ValidationLimits(secret=b"s3cret"))


@pytest.mark.parametrize(
    "key",
    [
        staged_key(
            "etl-20240601-0a1b2c", "sales", 17, 0, "date=2024-06-01/part-00017-6f1c2a7e-c000.snappy.parquet"
        ),
        published_key(
            "sales", "etl-20240601-0a1b2c", 17, "date=2024-06-01/part-00017-6f1c2a7e-c000.snappy.parquet"
        ),
    ],
)
def test_layout_examples_match_the_helpers(key: str) -> None:
    assert f"\n{key}\n" in DOC
