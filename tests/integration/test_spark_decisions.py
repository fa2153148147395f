"""The producer's pure decisions (no JVM): partition folders, winners, watermarks, config."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from shared import BadInput, ConfigError
from shared.events import DatasetExpectation, StagedFile, check_rel_path, published_key
from shared.spark import ProducerConfig, max_watermark, new_job_id
from shared.spark._job import check_datasets
from shared.spark._partitions import HIVE_NULL, check_partition_columns, partition_dir, split_table
from shared.spark._session import local_session_conf
from shared.spark._winners import TaskResult, expectation_from_results, looks_cancelled
from shared.spark._writer import rows_to_table, watermark_int
from tests._support.wait import wait_for_sync


def test_partition_dirs_escape_like_hive_and_stay_safe_relative_paths() -> None:
    assert partition_dir(["country"], ["fr"]) == "country=fr/"
    assert partition_dir(["a", "b"], ["x/y", None]) == f"a=x%2Fy/b={HIVE_NULL}/"
    assert partition_dir(["d"], [dt.date(2024, 1, 2)]) == "d=2024-01-02/"
    assert partition_dir(["flag"], [True]) == "flag=true/"
    assert partition_dir(["k"], ["..=%"]) == "k=..%3D%25/"
    folder = partition_dir(["a", "b"], ["../..", "c\\d"])
    check_rel_path(folder + "part-0.parquet")  # accepted by the fleet's own path rules
    assert published_key("ds", "job-1", 0, folder + "part-0.parquet").startswith("ds/a=..%2F..")
    with pytest.raises(BadInput):
        partition_dir(["a"], ["x" * 300])


def test_split_table_groups_rows_and_drops_partition_columns() -> None:
    table = pa.table({"id": [1, 2, 3, 4], "c": ["fr", "de", "fr", None]})
    parts = dict(split_table(table, ["c"]))
    assert set(parts) == {"c=de/", "c=fr/", f"c={HIVE_NULL}/"}
    assert parts["c=fr/"].to_pylist() == [{"id": 1}, {"id": 3}]
    assert split_table(table, []) == [("", table)]
    assert split_table(table.slice(0, 0), ["c"]) == []


def test_partition_columns_are_checked() -> None:
    assert check_partition_columns(["c"], ["id", "c"]) == ("c",)
    for bad in (["nope"], ["c", "c"], ["_c"], ["id", "c"]):
        with pytest.raises(BadInput):
            check_partition_columns(bad, ["id", "c", "_c"] if bad == ["_c"] else ["id", "c"])


def test_hive_folders_read_back_with_pyarrow(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    table = pa.table({"id": [1, 2, 3], "c": ["a b", "x/y", "z"]})
    for folder, part in split_table(table, ["c"]):
        (tmp_path / folder).mkdir(parents=True)
        pq.write_table(part, tmp_path / folder / "part-0.parquet")
    got = pads.dataset(tmp_path, partitioning="hive").to_table().to_pylist()
    assert sorted((r["id"], r["c"].replace("%2F", "/")) for r in got) == [(1, "a b"), (2, "x/y"), (3, "z")]


def test_winners_come_from_the_one_result_per_task() -> None:
    f = [StagedFile(path="part-0.parquet", size=3, md5="0" * 32)]
    results = [TaskResult(2, 0, f), TaskResult(0, 1, f), TaskResult(1, 0, [])]
    assert expectation_from_results("d", results) == DatasetExpectation(tasks=3, winners=[1, 0, 0])
    assert expectation_from_results("d", []) == DatasetExpectation(tasks=0, winners=[])
    with pytest.raises(BadInput, match="two results"):
        expectation_from_results("d", [TaskResult(0, 0, f), TaskResult(0, 1, f)])
    with pytest.raises(BadInput, match="missing"):
        expectation_from_results("d", [TaskResult(0, 0, f), TaskResult(2, 0, f)])


def test_cancellation_is_told_apart_by_text() -> None:
    assert looks_cancelled("org.apache.spark.SparkException: Job 3 cancelled part of cancelled job group j")
    assert looks_cancelled("Job 7 canceled because SparkContext was shut down")
    assert not looks_cancelled("Job aborted due to stage failure: Task 1 failed 2 times")


def test_watermark_values_and_max_watermark() -> None:
    assert watermark_int(5) == 5
    assert watermark_int(dt.datetime(1970, 1, 1, 0, 0, 1)) == 1_000_000
    assert watermark_int(dt.datetime(1970, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))) == 0
    assert watermark_int(dt.date(1970, 1, 11)) == 10
    for bad in (True, 1.5, "3"):
        with pytest.raises(BadInput):
            watermark_int(bad)
    fn = max_watermark("ts", "src")
    table = pa.table({"ts": pa.array([dt.datetime(2024, 1, 1), None], type=pa.timestamp("us", tz="UTC"))})
    assert fn(0, table) == {"src": 1_704_067_200_000_000}
    assert fn(0, table.slice(0, 0)) == {}


def test_rows_convert_to_arrow_with_nested_values_and_instants() -> None:
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("s", pa.struct([("a", pa.int32())])),
            ("ts", pa.timestamp("us", tz="UTC")),
        ]
    )

    class Row(tuple):  # the shape of a Spark Row: a tuple with asDict()
        def asDict(self) -> dict[str, int]:
            return {"a": self[0]}

    local = dt.datetime(2024, 1, 1, 12, 0)  # naive: PySpark's local time
    table = rows_to_table([(1, Row((7,)), local), (2, None, None)], schema)
    assert table.column("s").to_pylist() == [{"a": 7}, None]
    assert table.column("ts")[0].as_py() == local.astimezone(dt.UTC)
    assert rows_to_table([], schema).num_rows == 0


def test_config_job_ids_and_dataset_names_are_checked() -> None:
    cfg = ProducerConfig(redis_url="redis://127.0.0.1:1/0", store_url="file:///tmp/x")
    assert cfg.shards is None
    assert cfg.with_shards(8).shards == 8
    for bad in (
        {"store_url": "ftp://x"},
        {"redis_url": "http://x"},
        {"shards": 0},
        {"job_timeout": 0},
        {"upload_concurrency": 0},
    ):
        kwargs = {"redis_url": "redis://h/0", "store_url": "file:///tmp/x", **bad}
        with pytest.raises(ConfigError):
            ProducerConfig(**kwargs)  # type: ignore[arg-type]
    job = new_job_id("my app!")
    assert job.startswith("my-app-")
    assert check_datasets(["a", "b.c"]) == ("a", "b.c")
    for bad_names in ([], ["a", "a"], ["_staging"], ["a/b"]):
        with pytest.raises(BadInput):
            check_datasets(bad_names)


def test_session_conf_never_fetches_jars_and_stays_local(tmp_path: Path) -> None:
    conf = local_session_conf("x", master="local[2]", local_dir=tmp_path)
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert "-XX:TieredStopAtLevel=1" in conf["spark.driver.extraJavaOptions"]
    assert not any(k.startswith("spark.jars") for k in conf)
    from shared.spark import local_spark_session

    with pytest.raises(ConfigError, match=r"spark\.jars\.packages"):
        local_spark_session("x", extra_conf={"spark.jars.packages": "a:b:1"})
    with pytest.raises(ConfigError, match="local"):
        local_spark_session("x", master="yarn")


def test_executor_runtime_runs_coroutines_caches_stores_and_cancels_on_timeout(tmp_path: Path) -> None:
    import asyncio

    from shared.settings import StoreSettings
    from shared.spark._executor_runtime import ExecutorRuntime, process_runtime

    rt = ExecutorRuntime()
    try:

        async def add(a: int, b: int) -> int:
            await asyncio.sleep(0)
            return a + b

        assert rt.run(add(1, 2)) == 3
        url = tmp_path.as_uri()
        store = rt.store(url, StoreSettings())
        assert rt.store(url, StoreSettings()) is store  # one client per process, not per task
        info = rt.run(store.write_if_absent("a/b.bin", b"xyz"))
        assert info.size == 3
        assert (tmp_path / "a" / "b.bin").read_bytes() == b"xyz"

        cancelled = []

        async def hang() -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        with pytest.raises(TimeoutError):
            rt.run(hang(), timeout=0.1)
        wait_for_sync(lambda: cancelled, timeout=5, what="the timed-out coroutine to be cancelled")
    finally:
        rt.close()
        rt.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        rt.run(add(1, 1))
    assert process_runtime() is process_runtime()
