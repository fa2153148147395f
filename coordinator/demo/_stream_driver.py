"""The streaming demo's Spark driver: one Structured Streaming query, each micro-batch committed once.

``python -m coordinator.demo._stream_driver --config FLEET.toml --source DIR --checkpoint DIR``
reads the JSON files of ``--source`` (one per micro-batch), and commits each
batch to the dataset ``events`` (bound to the Iceberg table ``demo.events``)
through :func:`shared.spark.commit_batches`, until the source is consumed
(``trigger(availableNow=True)``). ``--kill-at POINT:BATCH`` is FAULT
INJECTION: the driver SIGKILLs itself at that point of that batch (e.g.
``batch.committed:3``: after the fleet committed batch 3, before Spark's commit
log recorded it). Prints one line per batch.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from shared.spark import BatchJob

APP_ID = "demo-stream"
DATASET = "events"
TABLE = "demo.events"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="commitfleet-stream-demo-driver")
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--source", required=True, type=Path)
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--kill-at", default="", help="POINT:BATCH, e.g. batch.committed:3")
    p.add_argument("--tmp", type=Path, default=None, help="Spark's scratch folder (default: a temp one)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the query until the source is consumed; return 0 (or die by SIGKILL at ``--kill-at``)."""
    from shared import load_settings
    from shared.spark import ProducerConfig, commit_batches, local_spark_session, max_watermark

    from ._spark_log import quiet_spark_conf

    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="  driver: %(message)s")
    logging.getLogger("shared.spark._stream").setLevel(logging.INFO)
    settings = load_settings(args.config, env={})
    config = ProducerConfig.from_settings(settings, app=APP_ID)
    kill_point, _, kill_batch = args.kill_at.partition(":")

    def probe(point: str, batch: int) -> None:
        if point == "batch.committed":
            print(f"  driver: batch {batch} committed", flush=True)
        if kill_point and (point, str(batch)) == (kill_point, kill_batch):
            print(f"  driver: killed (SIGKILL) at {point} of batch {batch}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def write(job: BatchJob, df: DataFrame, batch_id: int) -> None:
        job.write_dataset(df, DATASET, watermarks=max_watermark("id"), table=TABLE, mode="create")

    tmp = args.tmp or Path(tempfile.mkdtemp(prefix="stream-driver-"))
    tmp.mkdir(parents=True, exist_ok=True)
    quiet = quiet_spark_conf(tmp)
    spark = local_spark_session("commitfleet-stream-demo", master="local[2]", extra_conf=quiet, tmp_dir=tmp)
    committer = commit_batches(write, app_id=APP_ID, datasets=[DATASET], config=config, probe=probe)
    query = (
        spark.readStream.schema("id long, name string")
        .option("maxFilesPerTrigger", 1)
        .json(str(args.source))
        .writeStream.foreachBatch(committer)
        .option("checkpointLocation", str(args.checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
