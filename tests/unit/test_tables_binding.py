"""The table binding: carried by job_started into the shard's job state, resolved job first, then settings."""

from __future__ import annotations

import pytest

from shared import load_settings
from shared._errors import ConfigError
from shared.commit import (
    CommitRequest,
    StagedFile,
    WinningAttempt,
    catalog_properties,
    resolve_binding,
    table_step,
)
from shared.events import JobStarted, TableBinding, TaskFinished, published_key
from workers._core import ShardJobs, decide

BOUND = {"orders": TableBinding(table="lake.sales.orders", mode="create")}


def _started(tables: dict[str, TableBinding]) -> JobStarted:
    return JobStarted(job="j", datasets=["orders", "raw"], timeout_s=60, started_at=0.0, tables=tables)


def test_job_started_carries_the_binding_into_the_job_state_even_when_it_comes_late() -> None:
    state = ShardJobs()
    d = decide(state, _started(BOUND), now=1.0, default_timeout=60.0)
    assert d.job is not None and d.job.tables == BOUND

    late = ShardJobs()
    tf = TaskFinished(job="j", dataset="orders", task=0, attempt=0, files=[], finished_at=0.0)
    first = decide(late, tf, now=1.0, default_timeout=60.0)
    assert first.job is not None and first.job.tables == {}
    late.jobs["j"] = first.job
    then = decide(late, _started(BOUND), now=2.0, default_timeout=60.0)
    assert then.job is not None and then.job.tables == BOUND


def test_the_jobs_binding_wins_over_the_fleets_and_unbound_stays_unbound() -> None:
    settings = load_settings(
        env={},
        overrides={"tables": {"bindings": {"orders": {"table": "lake.x"}, "raw": {"table": "lake.raw"}}}},
    )
    assert resolve_binding(settings, "orders", BOUND) == BOUND["orders"]
    assert resolve_binding(settings, "raw", BOUND) == TableBinding(table="lake.raw", mode="append")
    assert resolve_binding(settings, "other", BOUND) is None


def test_the_table_step_lists_the_winners_published_parquet_files_only() -> None:
    files = [StagedFile(path="a/part-0.parquet", size=3), StagedFile(path="_SUCCESS.crc", size=1)]
    req = CommitRequest(
        dataset="orders",
        job="j",
        winners=[
            WinningAttempt(task=1, attempt=2, files=files),
            WinningAttempt(task=0, attempt=0, files=files),
        ],
        expected_tasks=2,
    )
    step = table_step(req, BOUND["orders"])
    assert step.files == [published_key("orders", "j", t, "a/part-0.parquet") for t in (0, 1)]
    assert (step.table, step.mode) == ("lake.sales.orders", "create")


def test_catalog_settings_the_warehouse_shares_the_store_and_bad_config_is_one_line() -> None:
    s = load_settings(env={}, overrides={"store": {"url": "file:///data/lake"}})
    props = catalog_properties(s, s.store.url)
    assert props["uri"] == "sqlite:////data/lake/_tables/catalog.db"
    assert props["warehouse"] == "file:///data/lake/_tables/warehouse"
    s3 = load_settings(
        env={},
        overrides={
            "store": {"url": "s3://b/p", "s3_endpoint_url": "http://127.0.0.1:9"},
            "tables": {"uri": "sqlite:////tmp/c.db"},
        },
    )
    props = catalog_properties(s3, s3.store.url)
    assert (props["warehouse"], props["s3.endpoint"]) == ("s3://b/p/_tables/warehouse", "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match=r"tables\.uri must be set for a rest catalog"):
        load_settings(env={}, overrides={"tables": {"catalog": "rest"}})
    with pytest.raises(ConfigError, match=r"namespace\.name"):
        load_settings(env={}, overrides={"tables": {"bindings": {"orders": {"table": "orders"}}}})


def test_the_producer_checks_a_binding_before_anything_runs() -> None:
    from shared._errors import BadInput
    from shared.spark._tables import check_binding

    assert check_binding("orders", "lake.sales.orders", "overwrite") == TableBinding(
        table="lake.sales.orders", mode="overwrite"
    )
    with pytest.raises(BadInput, match="namespace"):
        check_binding("orders", "orders", "append")
    with pytest.raises(BadInput, match="mode"):
        check_binding("orders", "lake.orders", "merge")


def test_a_delta_binding_names_no_table_and_a_binding_names_exactly_one_kind() -> None:
    import msgspec

    from shared.commit import CommitToDelta

    got = msgspec.json.decode(b'{"delta": true, "mode": "overwrite"}', type=TableBinding)
    assert got == TableBinding(delta=True, mode="overwrite") and got.table is None
    for bad in (b'{"delta": true, "table": "lake.x"}', b'{"mode": "append"}', b'{"delta": false}'):
        with pytest.raises(msgspec.ValidationError, match="exactly one"):
            msgspec.json.decode(bad, type=TableBinding)
    # An Iceberg binding encodes as before (a fleet without Delta reads it); a Delta one names only delta.
    assert msgspec.json.decode(msgspec.json.encode(BOUND["orders"])) == {
        "table": "lake.sales.orders",
        "mode": "create",
    }
    assert msgspec.json.decode(msgspec.json.encode(TableBinding(delta=True))) == {"delta": True}
    req = CommitRequest(
        dataset="orders",
        job="j",
        winners=[WinningAttempt(task=0, attempt=0, files=[StagedFile(path="d=1/p.parquet", size=3)])],
        expected_tasks=1,
    )
    step = table_step(req, TableBinding(delta=True))
    assert isinstance(step, CommitToDelta)
    assert step.files == [published_key("orders", "j", 0, "d=1/p.parquet")] and step.mode == "append"


def test_a_fleet_wide_delta_binding_resolves_and_a_table_with_it_is_refused() -> None:
    settings = load_settings(env={}, overrides={"tables": {"bindings": {"sales": {"delta": True}}}})
    assert resolve_binding(settings, "sales") == TableBinding(delta=True)
    with pytest.raises(ConfigError, match="not both"):
        load_settings(env={}, overrides={"tables": {"bindings": {"sales": {"delta": True, "table": "a.b"}}}})
