"""Per-task overhead of publishing TaskFinished from Spark executors (a script, not a test).

Runs, in one local SparkSession and on the same DataFrame, three actions with
one task per partition, interleaved over several rounds:

- ``spark``:   the task only counts its rows (Spark's own per-task cost);
- ``stage``:   the task stages its rows as Parquet in a local store (no publish);
- ``publish``: the real executor writer: stage, then publish TaskFinished.

and prints the wall time per task of each, the ratio ``publish / stage`` and
the in-task time spent in ``publish`` itself. Starts its own redis-server
(or uses ``--redis-url``)::

    .venv/bin/python -m tests.bench.spark_publish_overhead --tasks 200 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from shared.events import staged_key
from shared.spark import ProducerConfig, local_spark_session
from shared.spark._executor_runtime import process_runtime
from shared.spark._publishing import publisher_for
from shared.spark._writer import WriteSpec, encode_partition, upload_files, write_partition


def stage_only(spec: WriteSpec, rows: Iterable[Any]) -> Iterator[int]:
    """The writer without the publish step (same encoding, same store, same cached clients)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    assert tc is not None
    task, attempt = tc.partitionId(), tc.attemptNumber()
    files, _, _ = encode_partition(rows, spec, task)
    runtime = process_runtime()
    store = runtime.store(spec.config.store_url, spec.config.store)
    runtime.run(
        upload_files(
            store,
            lambda rel: staged_key(spec.job, spec.dataset, task, attempt, rel),
            files,
            spec.config.upload_concurrency,
        )
    )
    yield task


def publish_timing(spec: WriteSpec, rows: Iterable[Any]) -> Iterator[float]:
    """The real writer, plus the time one extra publish of a same-sized event takes in the task."""
    results = list(write_partition(spec, rows))
    from shared.events import TaskFinished

    r = results[0]
    ev = TaskFinished(
        job=spec.job,
        dataset=spec.dataset,
        task=r.task,
        attempt=r.attempt,
        files=r.files,
        finished_at=time.time(),
    )
    pub = publisher_for(spec.config)
    t0 = time.perf_counter()
    pub.publish(ev)
    yield time.perf_counter() - t0


def task_fn(kind: str, spec: WriteSpec) -> Any:
    """Return the mapPartitions function of one variant (``stage``, ``publish`` or ``timing``).

    ``stage`` and ``publish`` yield the task's own elapsed time (rows in to
    result out), which is far less noisy than the action's wall time on a
    busy machine.
    """
    if kind == "timing":
        return lambda rows: publish_timing(spec, rows)
    impl = {"stage": stage_only, "publish": write_partition}[kind]

    def run(rows: Iterable[Any]) -> Iterator[float]:
        t0 = time.perf_counter()
        for _ in impl(spec, rows):
            pass
        yield time.perf_counter() - t0

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--rows-per-task", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="")
    args = parser.parse_args()

    from pyspark.sql.pandas.types import to_arrow_schema

    from tests._support.redis_server import RedisServer

    with tempfile.TemporaryDirectory(prefix="cf-bench-") as tmp:
        server = None
        redis_url = args.redis_url
        if not redis_url:
            server = RedisServer(Path(tmp) / "redis")
            server.start()
            redis_url = server.url
        try:
            store_root = Path(tmp) / "store"
            store_root.mkdir()
            config = ProducerConfig(
                redis_url=redis_url, store_url=store_root.as_uri(), fleet="bench", shards=16
            )
            t0 = time.monotonic()
            spark = local_spark_session("bench-publish", master="local[2]", tmp_dir=Path(tmp) / "spark")
            spark.sparkContext.setLogLevel("ERROR")
            print(f"session ready in {time.monotonic() - t0:.1f}s")
            df = spark.range(0, args.tasks * args.rows_per_task, numPartitions=args.tasks).selectExpr(
                "id", "cast(id * 7 as string) as name"
            )
            schema = to_arrow_schema(df.schema, timezone="UTC")
            rdd = df.rdd

            def spec(job: str) -> WriteSpec:
                return WriteSpec(job=job, dataset="bench", config=config, arrow_schema=schema)

            def spark_only(rows: Iterable[Any]) -> Iterator[int]:
                yield sum(1 for _ in rows)

            # Warm-up: JVM JIT, Python workers, imports, cached clients.
            rdd.mapPartitions(spark_only).collect()
            rdd.mapPartitions(task_fn("stage", spec("warm-s"))).collect()
            rdd.mapPartitions(task_fn("publish", spec("warm-p"))).collect()

            times: dict[str, list[float]] = {"spark": [], "stage": [], "publish": []}
            in_task: dict[str, list[float]] = {"stage": [], "publish": []}
            publish_latency: list[float] = []
            for i in range(args.rounds):
                for name in ("spark", "stage", "publish"):
                    fn = spark_only if name == "spark" else task_fn(name, spec(f"{name}-{i}"))
                    t = time.perf_counter()
                    out = rdd.mapPartitions(fn).collect()
                    times[name].append((time.perf_counter() - t) / args.tasks)
                    if name in in_task:
                        in_task[name] += out
                publish_latency += rdd.mapPartitions(task_fn("timing", spec(f"timing-{i}"))).collect()

            med = {k: statistics.median(v) * 1000 for k, v in times.items()}
            inner = {k: statistics.median(v) * 1000 for k, v in in_task.items()}
            print(
                f"tasks per action: {args.tasks}, rows per task: {args.rows_per_task}, rounds: {args.rounds}"
            )
            for k, v in med.items():
                print(
                    f"  {k:8s} {v:7.2f} ms wall per task (action time / tasks, median over rounds; 2 slots)"
                )
            for k, v in inner.items():
                print(f"  {k:8s} {v:7.2f} ms inside the task (median over all tasks)")
            print(f"wall ratio publish / stage:      {med['publish'] / med['stage']:.3f}")
            print(f"in-task ratio publish / stage:   {inner['publish'] / inner['stage']:.3f}")
            extra = inner["publish"] - inner["stage"]
            print(
                f"publish step per task: {extra:+.2f} ms "
                f"= {extra / med['spark'] * 100:+.1f}% of Spark's own per-task time"
            )
            lat = sorted(publish_latency)
            print(
                f"in-task publish call:  median {statistics.median(lat) * 1000:.2f} ms, "
                f"p95 {lat[int(len(lat) * 0.95)] * 1000:.2f} ms (n={len(lat)})"
            )
            spark.stop()
        finally:
            if server is not None:
                server.kill()


if __name__ == "__main__":
    main()
