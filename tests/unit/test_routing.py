"""Shard routing, key names and the pure parts of the queue layer (no Redis)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import msgspec
import pytest
from redis.crc import key_slot

from shared.events import (
    DatasetExpectation,
    JobFinished,
    JobStarted,
    StagedFile,
    TaskFinished,
    ValidationLimits,
    decode_entry,
    event_datasets,
)
from shared.queue import Entry, Keys, group_by_shard, id_key, plan_entries, shard_of, split_by_shard
from shared.queue._dead_letters import dead_letter_fields, parse_dead_letter

# Fixed forever: changing any of these re-routes every dataset of every existing fleet.
GOLDEN = [
    ("orders", 64, 36),
    ("orders", 1000, 388),
    ("events.clicks", 64, 7),
    ("a", 64, 10),
    ("Ünïcødé-ds", 64, 22),
    ("sales_2024=eu", 64, 58),
    ("sales_2024=eu", 7, 0),
]


@pytest.mark.parametrize(("name", "shards", "expected"), GOLDEN)
def test_shard_of_golden_values(name: str, shards: int, expected: int) -> None:
    assert shard_of(name, shards) == expected


def test_shard_of_is_the_documented_rule() -> None:
    for i in range(200):
        name = f"ds-{i}"
        digest = hashlib.sha256(name.encode()).hexdigest()
        assert shard_of(name, 64) == int(digest[:16], 16) % 64


def test_shard_of_is_stable_across_processes_with_different_hash_seeds() -> None:
    names = [f"dataset_{i}" for i in range(50)] + ["Ünïcødé-ds"]
    expected = [shard_of(n, 64) for n in names]
    code = (
        "import sys, json; from shared.queue import shard_of; "
        "print(json.dumps([shard_of(n, 64) for n in json.loads(sys.argv[1])]))"
    )
    for seed in ("1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code, msgspec.json.encode(names).decode()],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            check=True,
            text=True,
        )
        assert msgspec.json.decode(out.stdout) == expected


def test_shard_of_is_balanced() -> None:
    shards, n = 64, 10_000
    counts = [0] * shards
    for i in range(n):
        counts[shard_of(f"warehouse.table_{i}", shards)] += 1
    expected = n / shards
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    # 63 degrees of freedom: p = 0.001 at about 103.4.
    assert chi2 < 103.4, (chi2, counts)
    assert min(counts) > expected * 0.6


def test_shard_of_rejects_no_shards() -> None:
    with pytest.raises(ValueError, match="shards"):
        shard_of("x", 0)


def test_group_by_shard_dedups_and_keeps_order() -> None:
    names = [f"d{i}" for i in range(30)] + ["d3", "d0"]
    groups = group_by_shard(names, 4)
    flat = [n for g in groups.values() for n in g]
    assert sorted(flat) == sorted(set(names))
    for shard, group in groups.items():
        assert all(shard_of(n, 4) == shard for n in group)
        assert group == sorted(group, key=names.index)


def _job_finished(names: list[str]) -> JobFinished:
    return JobFinished(
        job="job-1",
        datasets={n: DatasetExpectation(tasks=i + 1) for i, n in enumerate(names)},
        finished_at=1.0,
    )


def test_split_job_event_carries_only_each_shards_datasets() -> None:
    names = [f"ds{i}" for i in range(20)]
    ev = _job_finished(names)
    parts = split_by_shard(ev, 8)
    assert len(parts) == len({shard_of(n, 8) for n in names}) > 1
    seen: list[str] = []
    for shard, part in parts.items():
        assert isinstance(part, JobFinished)
        assert part.job == ev.job
        assert all(shard_of(n, 8) == shard for n in part.datasets)
        for n, exp in part.datasets.items():
            assert exp == ev.datasets[n]
        seen += list(part.datasets)
    assert sorted(seen) == sorted(names)

    started = JobStarted(job="job-1", datasets=names, timeout_s=60, started_at=1.0)
    for shard, part in split_by_shard(started, 8).items():
        assert event_datasets(part) == [n for n in names if shard_of(n, 8) == shard]


def test_split_task_finished_goes_to_its_datasets_shard_unchanged() -> None:
    ev = TaskFinished(
        job="j",
        dataset="orders",
        task=3,
        attempt=0,
        files=[StagedFile(path="p.parquet", size=1)],
        finished_at=1,
    )
    assert split_by_shard(ev, 64) == {36: ev}
    single = _job_finished(["orders"])
    assert split_by_shard(single, 64)[36] is single


def test_plan_entries_signs_and_routes() -> None:
    ev = _job_finished([f"ds{i}" for i in range(5)])
    plan = plan_entries([ev], 4, secret=b"s3cret")
    assert {shard for shard, _ in plan} == set(split_by_shard(ev, 4))
    limits = ValidationLimits(secret=b"s3cret")
    for shard, fields in plan:
        decoded = decode_entry(fields, limits=limits)
        assert decoded == split_by_shard(ev, 4)[shard]


def test_keys_share_one_cluster_slot_per_shard() -> None:
    keys = Keys("prod-1")
    assert keys.events(5) == "cf:prod-1:{s5}:events"
    assert keys.dead(5) == "cf:prod-1:{s5}:dead"
    assert keys.shard_state(5, "jobs") == "cf:prod-1:{s5}:state:jobs"
    slot = key_slot(keys.events(5).encode())
    assert key_slot(keys.dead(5).encode()) == slot
    assert key_slot(keys.shard_state(5, "open.jobs").encode()) == slot
    assert key_slot(keys.events(6).encode()) != slot
    assert keys.meta == "cf:prod-1:meta"
    assert keys.admin == "cf:prod-1:admin"
    assert keys.workers == "cf:prod-1:{cf:prod-1:admin}:workers"
    assert keys.fleet_key("assignment") == "cf:prod-1:{cf:prod-1:admin}:assignment"


@pytest.mark.parametrize("bad", ["", "a:b", "a{b}", "x" * 65, "a b"])
def test_keys_reject_bad_fleet_names(bad: str) -> None:
    with pytest.raises(ValueError, match="fleet"):
        Keys(bad)


def test_keys_reject_bad_state_names() -> None:
    keys = Keys("f")
    for bad in ("a:b", "{x}", "", "meta"):
        with pytest.raises(ValueError, match="name"):
            keys.shard_state(0, bad) if bad != "meta" else keys.fleet_key(bad)


def test_id_key_orders_like_redis() -> None:
    ids = [b"10-2", b"9-5", b"10-10", b"10-0"]
    assert sorted(ids, key=id_key) == [b"9-5", b"10-0", b"10-2", b"10-10"]


def test_dead_letter_fields_round_trip_and_cannot_be_forged() -> None:
    entry = Entry(b"5-1", {b"data": b"x" * 50, b"reason": b"forged", b"sig": b"ab"})
    fields = dead_letter_fields(
        entry, shard=3, reason="bad_json", detail="d" * 5000, consumer="w1", now_ms=7, max_copy_bytes=10
    )
    dl = parse_dead_letter(3, Entry(b"9-0", dict(fields)))
    assert dl.reason == "bad_json"
    assert dl.stream_id == b"5-1"
    assert dl.shard == 3
    assert dl.consumer == "w1"
    assert dl.dead_at_ms == 7
    assert len(dl.detail) == 2000
    assert dl.truncated
    assert dl.fields == {b"data": b"x" * 10, b"reason": b"forged", b"sig": b"ab"}
