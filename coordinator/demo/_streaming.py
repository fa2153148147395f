"""``commitfleet demo --streaming``: a Structured Streaming query through the fleet, killed and restarted.

After the fleet is up (as in the batch demo), the source folder gets
:data:`FILES` JSON files of :data:`ROWS_PER_FILE` rows with known ids, and the
driver (:mod:`._stream_driver`, a process of its own) runs the query one file
per micro-batch:

1. Run 1 is killed (SIGKILL) right after the fleet committed batch
   :data:`KILL_BATCH` and before Spark's commit log recorded it.
2. Run 2 restarts from the same checkpoint: Spark replays that batch, the
   driver skips it (the store's record says it is committed), and the query
   runs to the end of the source.
3. The check: every id exactly once in the published files and in the
   Iceberg table, one snapshot per batch in batch order, the app's record at
   the last batch, the audit clean, no staging left.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shared import Settings
from shared.commit import audit, read_manifest, read_stream_records
from shared.storage import open_store

from ._stream_driver import APP_ID, DATASET, TABLE

FILES = 6
ROWS_PER_FILE = 500
KILL_BATCH = 2
_DRIVER_TIMEOUT_S = 240.0


def write_source(folder: Path) -> int:
    """Write the source's JSON files (ids 0.. in order); return how many rows."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        rows = (
            json.dumps({"id": f * ROWS_PER_FILE + i, "name": f"row-{f * ROWS_PER_FILE + i}"})
            for i in range(ROWS_PER_FILE)
        )
        (folder / f"part-{f:03d}.json").write_text("\n".join(rows) + "\n")
    return FILES * ROWS_PER_FILE


def run_driver(
    config: Path, source: Path, checkpoint: Path, tmp: Path, console: Console, kill_at: str = ""
) -> int:
    """Run the driver process to its end; return its exit code (-9 when it killed itself)."""
    argv = [sys.executable, "-m", "coordinator.demo._stream_driver", "--config", str(config)]
    argv += ["--source", str(source), "--checkpoint", str(checkpoint), "--tmp", str(tmp)]
    if kill_at:
        argv += ["--kill-at", kill_at]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=_DRIVER_TIMEOUT_S, check=False)
    for line in proc.stdout.splitlines():
        console.print(line, markup=False, highlight=False)
    if proc.returncode not in (0, -9):
        console.print(proc.stderr[-3000:], markup=False, highlight=False)
    return proc.returncode


def streaming_runs(config: Path, work: Path, console: Console) -> tuple[int, bool]:
    """Write the source, run the driver killed once then to the end; return (rows, both runs as planned)."""
    source, checkpoint = work / "source", work / "checkpoint"
    rows = write_source(source)
    console.rule("[bold]Structured Streaming")
    console.print(
        f"source: {FILES} JSON files of {ROWS_PER_FILE} rows (ids 0-{rows - 1}), one file per micro-batch; "
        f"app {APP_ID}, dataset {DATASET} bound to the Iceberg table {TABLE}"
    )
    console.print(f"run 1: killed after the fleet commits batch {KILL_BATCH}, before Spark's commit log")
    kill_at = f"batch.committed:{KILL_BATCH}"
    first = run_driver(config, source, checkpoint, work / "driver-1", console, kill_at=kill_at)
    console.print("run 2: restarted from the same checkpoint (Spark replays the batch it did not log)")
    second = run_driver(config, source, checkpoint, work / "driver-2", console)
    planned = first == -9 and second == 0
    if not planned:
        console.print(f"[red]driver runs ended {first} and {second} (expected -9, then 0)[/]")
    return rows, planned


async def verify_stream(settings: Settings, rows: int, console: Console) -> bool:
    """Check the published files, the table, the record, the audit; print them; True when all hold."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    async with open_store(settings.store.url, settings.store) as store:
        records = await read_stream_records(store, APP_ID, [DATASET])
        rec = records.get(DATASET)
        jobs = sorted(
            {i.key.rsplit("/", 1)[1][: -len(".json")] async for i in store.list(f"{DATASET}/_commits/")}
        )
        ids: list[int] = []
        table = Table("job", "files", "rows", title=f"{DATASET}: one commit per micro-batch")
        for job in jobs:
            m = await read_manifest(store, DATASET, job)
            got = 0
            for f in m.files if m else []:
                data = (await store.read(f.key)).data
                col = pq.read_table(pa.BufferReader(data), columns=["id"]).column("id").to_pylist()
                ids += col
                got += len(col)
            table.add_row(job, str(len(m.files) if m else 0), str(got))
        console.print(table)
        report = await audit(store, settings=settings)
        staged = [i.key async for i in store.list("_staging/")]
    once = sorted(ids) == list(range(rows))
    last_batch = FILES - 1
    record_ok = rec is not None and rec.batch == last_batch
    table_ok, history = await asyncio.to_thread(_table_check, settings, rows)
    for line in history:
        console.print(line)
    console.print(
        f"published ids: {len(ids)} rows, {len(set(ids))} distinct of {rows} "
        + ("[green](each id exactly once)[/]" if once else "[red](NOT exactly once)[/]")
    )
    console.print(
        f"record of app {APP_ID} in {DATASET}: batch {rec.batch if rec else '-'} "
        + ("[green](the last batch)[/]" if record_ok else f"[red](expected {last_batch})[/]")
    )
    console.print(
        f"audit: {report.manifests} manifests, {len(report.violations)} violations; "
        f"staging left: {len(staged)}"
    )
    return once and record_ok and table_ok and report.ok and not staged


def _table_check(settings: Settings, rows: int) -> tuple[bool, list[str]]:
    from shared.commit import STREAM_BATCH_PROPERTY, load_table, open_catalog

    tbl = load_table(open_catalog(settings, settings.store.url), TABLE)
    if tbl is None:
        return False, [f"[red]table {TABLE} missing[/]"]
    batches = [int(s.summary.get(STREAM_BATCH_PROPERTY, "-1")) for s in tbl.metadata.snapshots if s.summary]
    ids = tbl.scan().to_arrow().column("id").to_pylist()
    ok = sorted(ids) == list(range(rows)) and batches == list(range(FILES))
    lines = [
        f"table {TABLE}: {len(ids)} rows, {len(batches)} snapshots, stream batches {batches} "
        + ("[green](one snapshot per batch, in order)[/]" if ok else "[red](expected one per batch)[/]")
    ]
    return ok, lines


__all__ = ["streaming_runs", "verify_stream", "write_source"]
