"""The PySpark job the cluster test submits with ``spark-submit`` (a user's driver script).

Usage: ``spark-submit ... cluster_job.py SPEC.json``. The spec names the job,
the fleet, the dataset, its size and how slow tasks are; the script writes the
dataset through ``commit_job`` and, when it returns, a result JSON (the
winners, where the driver and the executors imported ``shared`` from).

Imports ``shared`` the way a cluster user does: from the ``--py-files`` pack
(nothing else puts it on the path of a process started with an empty
environment).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main(spec_path: str) -> None:
    import msgspec
    from pyspark import TaskContext
    from pyspark.sql import SparkSession

    import shared
    from shared.settings import secret_dec_hook
    from shared.spark import ProducerConfig, commit_job

    with open(spec_path) as f:
        spec: dict[str, Any] = json.load(f)
    spark = SparkSession.builder.appName(spec["job"]).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cfg = msgspec.convert(spec["producer"], ProducerConfig, dec_hook=secret_dec_hook)
    slow_host, slow_s, task_s = spec["slow_host"], spec["slow_s"], spec["task_s"]

    def pace(task: int, table: Any) -> dict[str, int]:
        # Attempt 0 of every third task is slow on the slow host: Spark
        # launches a speculative copy on the other host, which wins.
        tc = TaskContext.get()
        assert tc is not None
        # The rows this attempt received, for the test to compare with what it published.
        with open(os.path.join(spec["marks"], f"{task}-{tc.attemptNumber()}"), "w") as mark:
            mark.write(f"{table.num_rows} {os.environ.get('SPARK_LOCAL_IP')}")
        slow = os.environ.get("SPARK_LOCAL_IP") == slow_host and tc.attemptNumber() == 0
        time.sleep(slow_s if slow and task % 3 == 0 else task_s)
        return {"max_id": int(max(table.column("id").to_pylist(), default=-1))}

    df = spark.range(0, spec["rows"], 1, spec["partitions"]).selectExpr("id", "id * 3 AS v")
    try:
        with commit_job(spark, spec["job"], [spec["dataset"]], config=cfg) as job:
            results = job.write_dataset(df, spec["dataset"], watermarks=pace)
    except BaseException as exc:
        with open(spec["result"] + ".error", "w") as out:
            out.write(f"{type(exc).__name__}: {exc}")
        raise
    # What commit_job reports about the fleet's outcome, when it reports one (job.results).
    outcome = msgspec.to_builtins(getattr(job, "results", None))
    where = spark.sparkContext.parallelize(range(4), 4).map(lambda _: __import__("shared").__file__)
    executors = where.collect()
    with open(spec["result"], "w") as out:
        json.dump(
            {
                "winners": {r.task: r.attempt for r in results},
                "outcome": outcome,
                "driver_shared": shared.__file__,
                "executor_shared": sorted(set(executors)),
            },
            out,
        )
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
