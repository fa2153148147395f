"""End to end on a real Spark standalone cluster: a master and two workers, jobs sent with spark-submit.

Marker ``spark_cluster`` (``make spark-cluster``; not in the default run: see
docs/e2e.md for its wall time). The module starts, once:

- a fleet (a coordinator and two workers) on a local-files store and the test
  session's redis-server;
- ``commitfleet pack``'s zip, which every job ships with ``--py-files`` as a user
  would: the cluster's processes start with an empty environment, so the zip
  is the only way ``shared`` reaches the driver and the executors;
- the cluster (tests/_support/spark_cluster.py): master and worker 1 on
  127.0.0.1, worker 2 on 127.0.0.2, 2 cores each.

Each test submits tests/_support/cluster_job.py in client deploy mode (the only
one for Python on standalone) with a spec, and checks the outcome in the store
and on the admin stream. Cases that need the driver to wait for its outcome
(job liveness) get their own test functions: a spec and :func:`run_job` are all
they need.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest
import redis.asyncio

from shared import Settings
from shared.commit import audit, read_manifest
from shared.events import Aborted, Committed, TaskFinished, ValidationLimits, decode_entry
from shared.fleet import FleetRegistry
from shared.queue import Keys, ensure_fleet_sync
from shared.settings import secret_dec_hook, secret_enc_hook
from shared.spark import ProducerConfig, build_pack
from shared.storage import ObjectStore, open_store
from tests._support.emulators import Emulator
from tests._support.fleet import fleet_settings
from tests._support.fleet_checks import admin_events
from tests._support.processes import FleetProcess, fleet_processes, write_config
from tests._support.redis_server import RedisHandle
from tests._support.spark_cluster import HOSTS, Cluster, Daemon, standalone_cluster
from tests._support.wait import wait_for

pytestmark = [pytest.mark.spark_cluster, pytest.mark.timeout(600)]

SHARDS = 4
SECRET = "cluster-secret"
JOB_SCRIPT = Path(__file__).parent.parent / "_support" / "cluster_job.py"
SUBMIT_TIMEOUT = 240.0


@dataclass
class ClusterRig:
    """The module's fleet, pack and cluster."""

    base: Path
    settings: Settings
    fleet_procs: list[FleetProcess]
    cluster: Cluster
    pack: Path

    def producer(self, job_timeout: float) -> dict[str, Any]:
        cfg = ProducerConfig.from_settings(self.settings, job_timeout=job_timeout, app="cluster")
        # The job needs the secrets' values: written out as the demo writes its config file.
        return msgspec.to_builtins(cfg, enc_hook=secret_enc_hook)  # type: ignore[no-any-return]

    def logs(self) -> str:
        fleet = "".join(f"\n===== {p.name} =====\n{p.output()[-4000:]}" for p in self.fleet_procs)
        return fleet + self.cluster.logs()


@pytest.fixture(scope="module")
def rig(redis_server: RedisHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRig]:
    started = time.monotonic()
    base = tmp_path_factory.mktemp("spark-cluster")
    (base / "store").mkdir()
    (base / "logs").mkdir()
    settings = fleet_settings(
        redis_server.url,
        base / "store",
        "cl" + secrets.token_hex(4),
        shards=SHARDS,
        security={"hmac_secret": SECRET},
        # Keep acknowledged entries: the speculation test reads every TaskFinished back.
        queue={"trim_interval": 0.0},
    )
    config = write_config(settings, base / "fleet.toml")
    client = redis.Redis.from_url(settings.redis.url)
    try:
        ensure_fleet_sync(client, settings.fleet.name, SHARDS)
    finally:
        client.close()
    pack = build_pack(base / "dist").archive
    with fleet_processes(base / "logs") as procs:
        procs.append(FleetProcess("coordinator", "c1", config, base / "logs"))
        procs.extend(FleetProcess("worker", w, config, base / "logs") for w in ("w1", "w2"))
        with standalone_cluster(base / "cluster") as cluster:
            sys.stderr.write(f"[figure] cluster and fleet up in {time.monotonic() - started:.1f}s\n")
            yield ClusterRig(base, settings, procs, cluster, pack)
    sys.stderr.write(f"[figure] cluster module wall time {time.monotonic() - started:.1f}s\n")


@pytest.fixture
async def r(rig: ClusterRig) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(rig.settings.redis.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def store(rig: ClusterRig) -> AsyncIterator[ObjectStore]:
    async with open_store(rig.settings.store.url, rig.settings.store) as s:
        yield s


@pytest.fixture
async def fleet(
    request: pytest.FixtureRequest, rig: ClusterRig, r: redis.asyncio.Redis
) -> AsyncIterator[ClusterRig]:
    """The rig once both fleet workers own every shard; every log goes to stderr if the test failed."""
    failed_before = request.session.testsfailed
    registry = FleetRegistry(r, Keys(rig.settings.fleet.name))

    async def settled() -> bool:
        for p in rig.fleet_procs:
            assert p.proc.poll() is None, f"{p.name} exited with {p.proc.returncode}"
        a = await registry.assignment(SHARDS)
        if set(a.owners()) != {"w1", "w2"} or any(s.owner is None or s.moving_to for s in a.slots):
            return False
        tokens = await registry.owner_tokens(SHARDS)
        return all(
            t is not None and t.decode().split("@")[0] == s.owner
            for s, t in zip(a.slots, tokens, strict=True)
        )

    await wait_for(settled, timeout=60, what="both fleet workers to own every shard")
    yield rig
    if request.session.testsfailed > failed_before:
        sys.stderr.write(rig.logs())


# -- helpers ---------------------------------------------------------------------

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.host": HOSTS[0],
    "spark.driver.bindAddress": HOSTS[0],
    "spark.executor.cores": "2",
    "spark.executor.memory": "512m",
    "spark.cores.max": "4",
    "spark.pyspark.python": sys.executable,
    "spark.pyspark.driver.python": sys.executable,
    "spark.task.maxFailures": "4",
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "2",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "500ms",
}


def job_spec(rig: ClusterRig, job: str, dataset: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "job": job,
        "dataset": dataset,
        "producer": rig.producer(job_timeout=overrides.pop("job_timeout", 300.0)),
        "rows": 6000,
        "partitions": 12,
        "slow_host": HOSTS[1],
        "slow_s": 8.0,
        "task_s": 0.5,
        "result": str(rig.base / f"{job}.result.json"),
        "marks": str(rig.base / f"{job}.marks"),
    }
    spec.update(overrides)
    Path(spec["marks"]).mkdir()
    return spec


def submit(rig: ClusterRig, spec: dict[str, Any]) -> Daemon:
    path = rig.base / f"{spec['job']}.spec.json"
    path.write_text(json.dumps(spec))
    events = rig.base / f"{spec['job']}.eventlog"
    events.mkdir()
    jvm_tmp = rig.base / "cluster" / f"{spec['job']}-jvm-tmp"  # not /tmp: nothing left behind
    jvm_tmp.mkdir(parents=True)
    java_opts = f"-XX:TieredStopAtLevel=1 -Djava.io.tmpdir={jvm_tmp}"
    conf = {
        **SPARK_CONF,
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.local.dir": str(rig.base / "cluster" / f"{spec['job']}-local"),
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    return rig.cluster.submit(spec["job"], JOB_SCRIPT, [str(path)], rig.pack, conf)


async def staged_any(store: ObjectStore, job: str) -> bool:
    async for _ in store.list(f"_staging/{job}/"):
        return True
    return False


async def job_events(r: redis.asyncio.Redis, rig: ClusterRig, job: str) -> list[Any]:
    """The admin events about ``job`` so far."""
    return [e for e in await admin_events(r, rig.settings.fleet.name) if getattr(e, "job", None) == job]


async def keys_under(store: ObjectStore, prefix: str) -> list[str]:
    return [i.key async for i in store.list(prefix)]


async def wait_exit(d: Daemon, timeout: float) -> int:
    async def done() -> bool:
        return d.proc.poll() is not None

    await wait_for(done, timeout=timeout, interval=0.2, what=f"spark-submit {d.name} to exit")
    return d.proc.returncode


async def run_job(rig: ClusterRig, spec: dict[str, Any]) -> tuple[int, dict[str, Any] | None, float]:
    """Submit ``spec`` and wait for spark-submit; return its exit code, the job's result JSON, the seconds."""
    t0 = time.monotonic()
    d = submit(rig, spec)
    code = await wait_exit(d, SUBMIT_TIMEOUT)
    result = Path(spec["result"])
    return code, (json.loads(result.read_text()) if result.exists() else None), time.monotonic() - t0


def task_ends(rig: ClusterRig, job: str) -> list[dict[str, Any]]:
    """The ``SparkListenerTaskEnd`` records of the job's Spark event log (every attempt, and how it ended)."""
    out = []
    for path in (rig.base / f"{job}.eventlog").rglob("*"):
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("Event") == "SparkListenerTaskEnd":
                out.append(rec)
    return out


async def task_finished_events(r: redis.asyncio.Redis, rig: ClusterRig, job: str) -> list[TaskFinished]:
    """The job's ``TaskFinished`` events still in the shard streams, decoded with the fleet's validation."""
    limits = ValidationLimits.from_settings(rig.settings.security, fleet=rig.settings.fleet.name)
    keys = Keys(rig.settings.fleet.name)
    out = []
    for shard in range(SHARDS):
        stream = keys.events(shard)
        for entry_id, fields in await r.xrange(stream):
            ev = decode_entry(fields, limits=limits, stream=stream, entry_id=entry_id)
            if isinstance(ev, TaskFinished) and ev.job == job:
                out.append(ev)
    return out


async def read_back(store: ObjectStore, dataset: str, job: str) -> list[tuple[int, int]]:
    """Return every committed row ``(id, v)`` of ``job`` in ``dataset``, read from the store with pyarrow."""
    manifest = await read_manifest(store, dataset, job)
    assert manifest is not None
    rows: list[tuple[int, int]] = []
    for f in manifest.files:
        table = pq.read_table(io.BytesIO((await store.read(f.key)).data))
        rows += zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True)
    return rows


# -- tests -------------------------------------------------------------------------


async def test_speculation_and_a_killed_executor_still_commit_every_row_exactly_once(
    fleet: ClusterRig, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    job, ds = "cl-spec-" + secrets.token_hex(3), "orders"
    spec = job_spec(fleet, job, ds)
    t0 = time.monotonic()
    d = submit(fleet, spec)

    # Once the job stages its first files, SIGKILL the executor on 127.0.0.1 in the middle of its tasks.
    async def staging() -> bool:
        assert d.proc.poll() is None, f"spark-submit exited with {d.proc.returncode}{fleet.logs()}"
        return await staged_any(store, job)

    await wait_for(staging, timeout=120, interval=0.1, what="the job to stage files")
    victims = fleet.cluster.executors(HOSTS[0])
    assert len(victims) == 1, victims
    os.kill(victims[0], signal.SIGKILL)

    code = await wait_exit(d, SUBMIT_TIMEOUT)
    assert code == 0, f"spark-submit exited with {code}{d.tail(8000)}"
    spark_s = time.monotonic() - t0
    result = json.loads(Path(spec["result"]).read_text())

    async def committed() -> bool:
        return await read_manifest(store, ds, job) is not None and not await staged_any(store, job)

    await wait_for(committed, timeout=60, what=f"{ds} to be committed and its staging cleaned")
    rows = await read_back(store, ds, job)
    assert sorted(rows) == [(i, 3 * i) for i in range(spec["rows"])], "every row exactly once"
    evs = await job_events(r, fleet, job)
    assert [type(e) for e in evs if isinstance(e, Committed | Aborted)] == [Committed]
    report = await audit(store)
    assert report.ok, report.violations

    # The code came from the pack, on the driver and on every executor.
    assert fleet.pack.name in result["driver_shared"]
    assert result["executor_shared"] and all(".zip/shared/" in p for p in result["executor_shared"])
    # What Spark did (its event log): speculative copies ran on the other host, attempts were killed
    # (another attempt won) or lost with the executor; some winners are not attempt 0.
    ends = task_ends(fleet, job)
    # The write's stage is the one with 12 tasks (the preflight and the import probe have 1 and 4).
    stage = max({e["Stage ID"] for e in ends}, key=lambda s: sum(e["Stage ID"] == s for e in ends))
    write = [e for e in ends if e["Stage ID"] == stage]
    for e in write:
        ti, why = e["Task Info"], e["Task End Reason"]
        took = (ti["Finish Time"] - ti["Launch Time"]) / 1000
        sys.stderr.write(
            f"  task {ti['Index']} attempt {ti['Attempt']} on {ti['Host']} spec={ti['Speculative']} "
            f"{why['Reason']} {why.get('Kill Reason', '')} {took:.1f}s\n"
        )
    speculative = [e for e in write if e["Task Info"]["Speculative"]]
    killed = [e for e in write if e["Task End Reason"]["Reason"] == "TaskKilled"]
    lost = [e for e in write if e["Task End Reason"]["Reason"] == "ExecutorLostFailure"]
    assert speculative, "a speculative copy ran"
    assert lost, "the SIGKILLed executor's tasks were lost"
    assert {e["Task Info"]["Host"] for e in speculative} <= set(HOSTS)
    retried = {t: a for t, a in result["winners"].items() if a > 0}
    assert retried, result["winners"]

    # Every attempt that published had received its whole partition (500 rows), killed or not.
    published = await task_finished_events(r, fleet, job)
    assert len(published) >= spec["partitions"], "the task events are still in the streams"
    marks = {p.name: p.read_text().split() for p in Path(spec["marks"]).iterdir()}
    per_task = spec["rows"] // spec["partitions"]
    for ev in published:
        assert marks[f"{ev.task}-{ev.attempt}"][0] == str(per_task), (ev.task, ev.attempt, marks)
    cut = sorted(k for k, (rows, _host) in marks.items() if int(rows) < per_task)
    sys.stderr.write(
        f"[figure] cluster job: spark-submit {spark_s:.1f}s; write stage: {len(write)} attempts, "
        f"{len(speculative)} speculative, {len(killed)} killed, {len(lost)} lost with the executor; "
        f"winners not attempt 0: {retried}; attempts that saw a cut partition: {cut} (none published); "
        f"{len(published)} TaskFinished\n"
    )


async def test_a_driver_killed_mid_write_is_aborted_and_nothing_is_published(
    fleet: ClusterRig, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    job, ds = "cl-kill-" + secrets.token_hex(3), "refunds"
    spec = job_spec(fleet, job, ds, job_timeout=10.0, slow_s=2.0, task_s=2.0)
    d = submit(fleet, spec)

    async def staging() -> bool:
        assert d.proc.poll() is None, f"spark-submit exited with {d.proc.returncode}{fleet.logs()}"
        return await staged_any(store, job)

    await wait_for(staging, timeout=120, interval=0.1, what="the job to stage files")
    os.killpg(d.proc.pid, signal.SIGKILL)  # the driver JVM and its Python, at once
    killed_at = time.monotonic()

    async def aborted() -> list[Aborted] | None:
        return [e for e in await job_events(r, fleet, job) if isinstance(e, Aborted)] or None

    evs = await wait_for(aborted, timeout=90, what=f"the fleet to abort {job}")
    sys.stderr.write(f"[figure] driver SIGKILLed: aborted {time.monotonic() - killed_at:.1f}s later\n")
    assert [e.dataset for e in evs] == [ds]
    assert not [e for e in await job_events(r, fleet, job) if isinstance(e, Committed)]

    async def clean() -> bool:
        # Tasks of the dead driver may still stage files for a moment; the fleet removes late ones too.
        return not await staged_any(store, job)

    await wait_for(clean, timeout=60, what=f"nothing staged for {job}")
    assert await read_manifest(store, ds, job) is None
    assert await keys_under(store, f"{ds}/") == [], "nothing published"
    assert (await audit(store)).ok


async def test_executors_without_store_credentials_stop_the_job_at_preflight(
    fleet: ClusterRig, r: redis.asyncio.Redis, s3_emulator: Emulator
) -> None:
    """The issue's deployment mistake: executors without store credentials end the job at once, one line."""
    job, ds = "cl-creds-" + secrets.token_hex(3), "orders"
    producer = dict(fleet.producer(job_timeout=300.0))
    producer["store_url"] = f"s3://cf-session/cluster-{job}"
    producer["store"] = msgspec.to_builtins(s3_emulator.settings(), enc_hook=secret_enc_hook)
    spec = job_spec(fleet, job, ds, producer=producer)
    code, result, took = await run_job(fleet, spec)
    assert code != 0 and result is None
    error = Path(spec["result"] + ".error").read_text()
    assert error.startswith(f"ConfigError: preflight for job {job} failed on the executors:"), error
    lines = error.splitlines()[1:]
    assert len(lines) == 1 and lines[0].startswith(f"  store s3://cf-session/cluster-{job}"), lines
    assert "credentials" in lines[0]
    ends = task_ends(fleet, job)
    assert len(ends) == 1 and ends[0]["Task End Reason"]["Reason"] == "Success", "one probe task, not retried"
    assert not await job_events(r, fleet, job), "the job never started"
    sys.stderr.write(f"[figure] executors without credentials: spark-submit failed after {took:.1f}s\n")


# -- job liveness (issue 15, items 1 and 2: the driver keeps its job alive and learns its outcome) --------


async def test_a_job_running_past_the_old_hard_timeout_commits_and_commit_job_returns_its_results(
    fleet: ClusterRig, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    job, ds = "cl-long-" + secrets.token_hex(3), "sessions"
    # Three waves of 4-s tasks: the write alone outlasts the 8-s job_timeout.
    spec = job_spec(fleet, job, ds, job_timeout=8.0, slow_s=4.0, task_s=4.0)
    code, result, took = await run_job(fleet, spec)
    assert took > 8.0
    assert code == 0, Path(spec["result"] + ".error").read_text() if code else ""
    assert result is not None
    assert await read_manifest(store, ds, job) is not None, "committed although it ran past job_timeout"
    assert sorted(await read_back(store, ds, job)) == [(i, 3 * i) for i in range(spec["rows"])]
    outcome = result["outcome"]
    assert outcome is not None and outcome[ds]["status"] == "committed", outcome


async def test_a_dataset_aborted_while_the_job_runs_makes_commit_job_raise(
    fleet: ClusterRig, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    from shared.events import JobFailed
    from shared.spark._publishing import publish

    job, ds = "cl-abort-" + secrets.token_hex(3), "payments"
    spec = job_spec(fleet, job, ds, slow_s=2.0, task_s=2.0)
    d = submit(fleet, spec)

    async def staging() -> bool:
        assert d.proc.poll() is None, f"spark-submit exited with {d.proc.returncode}{fleet.logs()}"
        return await staged_any(store, job)

    await wait_for(staging, timeout=120, interval=0.1, what="the job to stage files")
    # An operator (or another system) fails the job's dataset while the driver is still writing it.
    producer = msgspec.convert(spec["producer"], ProducerConfig, dec_hook=secret_dec_hook)
    publish(producer, JobFailed(job=job, datasets=[ds], reason="operator: bad source", failed_at=time.time()))

    async def aborted() -> bool:
        return any(isinstance(e, Aborted) for e in await job_events(r, fleet, job))

    await wait_for(aborted, timeout=60, what=f"the fleet to abort {job}")
    code = await wait_exit(d, SUBMIT_TIMEOUT)
    assert code != 0, "the driver must not report success for an aborted dataset"
    error = Path(spec["result"] + ".error").read_text()
    assert ds in error and "operator: bad source" in error, error
    assert await read_manifest(store, ds, job) is None
