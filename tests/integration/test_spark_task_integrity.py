"""Task attempts that Spark kills, and errors no retry can fix, against a real local Spark.

One SparkSession for the module (``local[2,4]``: a failing task would be run four
times). Its executors get no AWS credentials (``spark.executorEnv``), as on a
cluster where only the driver has them, while the driver keeps the test
session's dummy ones.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import redis

from shared import ConfigError
from shared.events import JobCancelled, JobFailed, TaskFinished, ValidationLimits, decode_entry
from shared.queue import Keys
from shared.spark import ProducerConfig, commit_job
from tests._support.emulators import Emulator
from tests._support.spark import spark_session_fixture
from tests._support.wait import wait_for_sync

pytestmark = pytest.mark.spark

NO_AWS_CREDENTIALS = {
    "spark.executorEnv.AWS_ACCESS_KEY_ID": "",
    "spark.executorEnv.AWS_SECRET_ACCESS_KEY": "",
    "spark.executorEnv.AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
    "spark.executorEnv.AWS_CONFIG_FILE": "/nonexistent/config",
    "spark.executorEnv.AWS_EC2_METADATA_DISABLED": "true",
}

spark = spark_session_fixture("test-spark-task-integrity", master="local[2,4]", extra_conf=NO_AWS_CREDENTIALS)

SHARDS = 2
ROWS_PER_TASK = 1000


def events_of(cfg: ProducerConfig, job: str) -> list[Any]:
    client = redis.Redis.from_url(cfg.redis_url)
    try:
        keys = Keys(cfg.fleet)
        out = []
        for shard in range(SHARDS):
            for _id, fields in client.xrange(keys.events(shard)):
                ev = decode_entry(fields, limits=ValidationLimits())
                if ev.job == job:
                    out.append(ev)
        return out
    finally:
        client.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_attempts_killed_mid_partition_stage_and_publish_nothing(
    spark: Any, redis_url: str, fleet_name: str, tmp_path: Path
) -> None:
    """The issue's case: attempts killed while their rows arrive see a cut (often empty) partition.

    The rows come slowly from a Python UDF upstream; once both tasks are
    reading (the UDF holds each partition at its 50th row until then), the job
    is cancelled (Spark kills both attempts). Each attempt
    records, from its watermark function (called once its rows ended), the
    number of rows it saw and its pid; the test waits for those records and for
    the worker processes to exit (an attempt's code has run to its end then),
    and checks that neither attempt staged or published anything.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    marks = tmp_path / "marks"
    marks.mkdir()
    store_root = tmp_path / "store"
    cfg = ProducerConfig(
        redis_url=redis_url, store_url=store_root.as_uri(), fleet=fleet_name, shards=SHARDS, app="kill"
    )

    @F.udf(T.LongType(), useArrow=False)
    def slowly(x: int) -> int:
        if x % ROWS_PER_TASK == 50:
            (marks / f"reading-{x // ROWS_PER_TASK}").touch()
            # Neither task may get through its partition before the kill.
            deadline = time.monotonic() + 60
            while not (marks / "killed").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return x

    def record(task: int, table: pa.Table) -> dict[str, int]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        assert tc is not None
        (marks / f"ended-{task}-{tc.attemptNumber()}").write_text(f"{table.num_rows} {os.getpid()}")
        return {}

    df = spark.range(0, 2 * ROWS_PER_TASK, 1, 2).select(slowly("id").alias("id"))
    job_id = "kill-" + secrets.token_hex(4)

    def cancel_when_reading(job: Any) -> None:
        wait_for_sync(
            lambda: all((marks / f"reading-{t}").exists() for t in (0, 1)),
            timeout=60,
            what="both tasks to be reading their rows",
        )
        job.cancel("test kills the attempts")
        (marks / "killed").touch()

    def run() -> None:
        with commit_job(spark, job_id, ["cut"], config=cfg) as job:
            canceller = threading.Thread(target=cancel_when_reading, args=(job,))
            canceller.start()
            try:
                job.write_dataset(df, "cut", watermarks=record)
            finally:
                canceller.join()

    with pytest.raises(Exception, match=r"(?i)cancel"):
        run()

    ended = wait_for_sync(
        lambda: sorted(marks.glob("ended-*")) if len(list(marks.glob("ended-*"))) >= 2 else None,
        timeout=30,
        what="both killed attempts to reach the end of their rows",
    )
    seen = {p.name: tuple(int(v) for v in p.read_text().split()) for p in ended}
    # The scenario really happened: both attempts saw a partition cut short.
    assert sorted(seen) == ["ended-0-0", "ended-1-0"], seen
    assert all(rows < ROWS_PER_TASK for rows, _pid in seen.values()), seen
    for _rows, pid in seen.values():
        wait_for_sync(lambda pid=pid: not _alive(pid), timeout=30, what=f"python worker {pid} to exit")

    evs = events_of(cfg, job_id)
    assert [type(e) for e in evs if isinstance(e, TaskFinished)] == []
    assert any(isinstance(e, JobCancelled) for e in evs)
    staged = store_root / "_staging" / job_id
    assert not staged.exists() or not [p for p in staged.rglob("*") if p.is_file()]


def test_executors_without_store_credentials_fail_the_job_once_without_retries(
    spark: Any, redis_url: str, fleet_name: str, s3_emulator: Emulator
) -> None:
    """Every task hits NoCredentialsError on every file: one ConfigError on the driver, no task retried."""
    cfg = ProducerConfig(
        redis_url=redis_url,
        store_url=f"s3://cf-session/creds-{secrets.token_hex(4)}",
        store=s3_emulator.settings(),
        fleet=fleet_name,
        shards=SHARDS,
        app="creds",
        preflight=False,  # it would catch this first: here the tasks meet the error themselves
    )
    # Three Hive folders per task: three files, three failures per attempt.
    df = spark.createDataFrame([(i, f"k{i % 3}") for i in range(12)], "id long, k string").repartition(2)
    job_id = "creds-" + secrets.token_hex(4)
    started = time.monotonic()
    with (
        pytest.raises(ConfigError, match=r"(?s)executors reported.*credentials") as info,
        commit_job(spark, job_id, ["nocreds"], config=cfg) as job,
    ):
        job.write_dataset(df, "nocreds", partition_by=["k"])
    elapsed = time.monotonic() - started

    text = str(info.value)
    assert text.count("\n") == 1, text  # one distinct error: one line, naming both tasks
    assert "tasks 0,1:" in text
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    stages = [s for j in tracker.getJobIdsForGroup(job_id) for s in tracker.getJobInfo(j).stageIds]
    infos = [tracker.getStageInfo(s) for s in stages]
    assert infos
    assert sum(i.numFailedTasks for i in infos if i is not None) == 0
    evs = events_of(cfg, job_id)
    assert not [e for e in evs if isinstance(e, TaskFinished)]
    assert [e.reason.split(":")[0] for e in evs if isinstance(e, JobFailed)] == ["ConfigError"]
    assert elapsed < 60


def test_preflight_names_every_problem_in_one_error_before_the_job_starts(
    spark: Any, redis_url: str, fleet_name: str, s3_emulator: Emulator
) -> None:
    """Executors without store credentials and a Redis nobody listens on: two lines, no job, no retries."""
    from tests._support.ports import free_port

    dead_redis = f"redis://user:secret@127.0.0.1:{free_port()}/0"
    cfg = ProducerConfig(
        redis_url=dead_redis,
        store_url=f"s3://cf-session/pre-{secrets.token_hex(4)}",
        store=s3_emulator.settings(),
        fleet=fleet_name,
        shards=SHARDS,
        redis_socket_timeout=2.0,
    )
    sc = spark.sparkContext
    failed_before = _failed_tasks(sc)
    with (
        pytest.raises(ConfigError, match="preflight for job pre-1 failed on the executors") as info,
        commit_job(spark, "pre-1", ["d"], config=cfg),
    ):
        pytest.fail("the body must not run")
    lines = str(info.value).splitlines()[1:]
    assert len(lines) == 2, lines
    assert lines[0].startswith("  store s3://cf-session/pre-") and "credentials" in lines[0]
    assert lines[1].startswith("  redis redis://user:**********@127.0.0.1:") and "secret" not in lines[1]
    assert _failed_tasks(sc) == failed_before
    assert events_of(msgspec_replace(cfg, redis_url=redis_url), "pre-1") == []  # no JobStarted


def test_preflight_passes_leaves_no_probe_object_and_can_be_turned_off(
    spark: Any, redis_url: str, fleet_name: str, tmp_path: Path
) -> None:
    from shared.spark._preflight import run_preflight

    root = tmp_path / "store"
    cfg = ProducerConfig(redis_url=redis_url, store_url=root.as_uri(), fleet=fleet_name, shards=SHARDS)
    run_preflight(spark, "pre-2", cfg)
    assert not [p for p in root.rglob("*") if p.is_file() and "_staging" in p.parts]
    # The probe really writes under the job's staging prefix: where that cannot be a folder, it says so.
    (root / "_staging").mkdir(exist_ok=True)
    (root / "_staging" / "pre-4").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"\n  store file://.*\(write _staging/pre-4/_preflight-") as info:
        run_preflight(spark, "pre-4", cfg)
    assert len(str(info.value).splitlines()) == 2
    off = msgspec_replace(cfg, redis_url="redis://127.0.0.1:1/0", preflight=False)
    run_preflight(spark, "pre-3", off)  # no probe: nothing contacts the dead Redis


def _failed_tasks(sc: Any) -> int:
    tracker = sc.statusTracker()
    infos = [tracker.getStageInfo(s) for s in range(1000)]
    return sum(i.numFailedTasks for i in infos if i is not None)


def msgspec_replace(cfg: ProducerConfig, **changes: Any) -> ProducerConfig:
    import msgspec

    return msgspec.structs.replace(cfg, **changes)
