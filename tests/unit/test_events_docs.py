"""docs/contract.md stays true: its examples decode, its test vector and keys are right."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import msgspec
import pytest

from shared.events import (
    JobStarted,
    TaskFinished,
    ValidationLimits,
    decode_admin,
    decode_bound,
    decode_event,
    encode_bound,
    published_key,
    sign,
    staged_key,
    type_params,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```([^\n]*)\n(.*?)```", DOC, flags=re.S)


def test_every_queue_json_example_decodes() -> None:
    queue = [body for info, body in BLOCKS if info.strip() == "json"]
    assert len(queue) == 7  # one per event type, a streaming job_started, a task_finished with file stats
    events = [decode_event(body.strip().encode(), sig=None, limits=ValidationLimits()) for body in queue]
    assert len({type(ev) for ev in events}) == 5
    assert [ev.stream.batch for ev in events if isinstance(ev, JobStarted) and ev.stream is not None] == [7]
    stats = [
        f.stats for ev in events if isinstance(ev, TaskFinished) for f in ev.files if f.stats is not None
    ]
    assert len(stats) == 1 and stats[0].rows == 3 and stats[0].columns["note"].upper_cut


def test_stats_vectors_match_the_code() -> None:
    """Each vector: the bound decodes, encodes back to the same JSON, and gives the Iceberg bytes shown."""
    pytest.importorskip("pyiceberg")
    from pyiceberg.conversions import to_bytes
    from pyiceberg.types import PrimitiveType

    (body,) = [body for info, body in BLOCKS if info.strip() == "text stats-vectors"]
    lines = [line.split() for line in body.splitlines() if line.strip()]
    assert len(lines) == 15
    kinds = set()
    for type_name, sent, iceberg_hex in lines:
        value = decode_bound(type_name, msgspec.json.decode(sent))
        assert msgspec.json.encode(encode_bound(type_name, value)).decode() == sent
        iceberg_type = PrimitiveType.model_validate(
            type_name.replace(",", ", ") if "(" in type_name else type_name
        )
        assert to_bytes(iceberg_type, value).hex() == iceberg_hex, type_name
        kinds.add(type_params(type_name))
    assert {k[0] for k in kinds if k is not None} >= {
        "boolean",
        "int",
        "long",
        "float",
        "double",
        "decimal",
        "date",
        "time",
        "timestamp",
        "timestamptz",
        "string",
        "binary",
        "fixed",
    }


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
