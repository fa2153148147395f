"""``commitfleet job`` and ``commitfleet dataset`` as an operator runs them (a subprocess) against a real
Redis and a local store: text and JSON, every dataset of a big job with ``--all``, and the exit codes of a bad
name (2), an unknown one (4) and an unreachable Redis (3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis.asyncio

from shared import Settings, load_settings
from shared.queue import Keys, ensure_fleet
from shared.storage import open_store
from tests._support.cli import cli, cli_env
from tests._support.pages import (
    BIG,
    COMMITS,
    DATASET,
    GLOB_NAME,
    JOB,
    QUARANTINE_REASON,
    SHARDS,
    big_names,
    seed_pages,
)


@pytest.fixture
async def env(
    redis_client: redis.asyncio.Redis, redis_url: str, fleet_name: str, tmp_path: Path
) -> dict[str, str]:
    root = tmp_path / "store"
    root.mkdir()
    s: Settings = load_settings(
        env={}, overrides={"fleet": {"name": fleet_name, "shards": SHARDS}, "store": {"url": root.as_uri()}}
    )
    await ensure_fleet(redis_client, fleet_name, SHARDS)
    async with open_store(s.store.url, s.store) as store:
        await seed_pages(redis_client, Keys(fleet_name), s, store)
    return cli_env(REDIS_URL=redis_url, COMMITFLEET_FLEET_NAME=fleet_name, COMMITFLEET_STORE=root.as_uri())


async def test_job_text_json_and_every_dataset(env: dict[str, str]) -> None:
    res = await cli("job", JOB, "--limit", "5", env=env)
    assert res.rc == 0, res.err
    assert f"job {JOB}  liveness alive" in res.out
    assert "more datasets: --cursor" in res.out
    res = await cli("job", JOB, "--json", "--limit", "5", env=env)
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert len(doc["datasets"]) == 5 and doc["next"] and doc["liveness"]["state"] == "alive"
    # --all --json: the page's head, then one line per dataset, every one once.
    res = await cli("job", JOB, "--all", "--json", "--limit", "300", env=env)
    assert res.rc == 0, res.err
    head, *rows = res.json_lines()
    assert head["job"] == JOB and "datasets" not in head
    names = [r["dataset"] for r in rows]
    assert len(names) == BIG and set(names) == set(big_names())
    res = await cli("job", JOB, "--all", env=env)
    assert res.rc == 0, res.err
    assert all(n in res.out for n in big_names()[:: BIG // 20])


async def test_dataset_text_and_json(env: dict[str, str]) -> None:
    res = await cli("dataset", DATASET, env=env)
    assert res.rc == 0, res.err
    assert "lock: released  holder worker-7  epoch 1" in res.out
    assert f"job-c{COMMITS - 1:02d}" in res.out
    assert QUARANTINE_REASON in res.out
    assert f"commitfleet retry {DATASET} job-q" in res.out
    # A name with Rich markup and glob characters is printed as it is.
    res = await cli("dataset", GLOB_NAME, env=env)
    assert res.rc == 0, res.err
    assert f"dataset {GLOB_NAME}  shard" in res.out
    res = await cli("job", "job-c11", env=env)
    assert res.rc == 0, res.err
    assert "no shard holds this job now" in res.out and "committed dataset=sales job=job-c11" in res.out
    res = await cli("dataset", DATASET, "--json", "--commits", "3", env=env)
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    assert [c["job"] for c in doc["store"]["commits"]] == [f"job-c{i:02d}" for i in (11, 10, 9)]
    assert doc["quarantined"][0]["job"] == "job-q"


@pytest.mark.parametrize(
    ("args", "rc", "needle"),
    [
        (("job", "bad job"), 2, "does not match"),
        (("job", "-x"), 2, ""),
        (("job", "no-such-job"), 4, "no such job"),
        (("dataset", "_wal"), 2, "not one safe segment"),
        (("dataset", "a/b"), 2, "not one safe segment"),
        (("dataset", "nothing-here"), 4, "no such dataset"),
        (("job", JOB, "--cursor", "zz"), 2, "bad cursor"),
    ],
)
async def test_bad_and_unknown_names_exit_2_and_4(
    env: dict[str, str], args: tuple[str, ...], rc: int, needle: str
) -> None:
    res = await cli(*args, env=env)
    assert res.rc == rc, (res.rc, res.out, res.err)
    assert needle in res.err
    assert "Traceback" not in res.err


async def test_redis_unreachable_exits_3() -> None:
    for args in (("job", JOB), ("dataset", DATASET)):
        res = await cli(*args, env=cli_env(REDIS_URL="redis://127.0.0.1:9/0"), timeout=30)
        assert res.rc == 3, (res.rc, res.out, res.err)
        assert "Traceback" not in res.err
