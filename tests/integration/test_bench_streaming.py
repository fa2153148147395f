"""``python -m tests.bench.streaming_overhead`` at a tiny size: every side runs and is checked, the report
holds every figure (a real local Spark, a fleet of processes, the session's redis-server)."""

from __future__ import annotations

import io

import pytest

from tests._support.streaming_bench import PHASES, Options, parse, run


@pytest.mark.spark
@pytest.mark.bench  # 13 s of Spark: pytest -m bench
def test_the_streaming_bench_runs_end_to_end(redis_url: str) -> None:
    opts = Options(
        batches=2,
        warmup=1,
        partitions=(2,),
        rows=10,
        stores=("local", "latency"),
        latency_ms=2.0,
        workers=1,
        redis_url=redis_url,
        sides=("parquet", "fleet", "fleet-cloud"),
        rounds=1,
        warm=False,
    )
    out = io.StringIO()
    report = run(opts, out)

    got = sorted((r.store, r.side, r.partitions, len(r.batches)) for r in report.runs)
    assert got == [
        ("latency", "fleet", 2, 2),
        ("latency", "fleet-cloud", 2, 2),
        ("latency", "parquet", 2, 2),
        ("local", "fleet", 2, 2),
        ("local", "parquet", 2, 2),
    ]
    for r in report.runs:
        # Counted batches are the ones after the warm-up, each with Spark's own durations.
        assert [b.batch for b in r.batches] == [1, 2]
        assert all(b.trigger_ms >= b.add_ms > 0 for b in r.batches)
        if r.side != "parquet":
            # Each batch committed (fleet_run checked its manifest) and timed phase by phase.
            assert all(set(b.phases) == set(PHASES) for b in r.batches)
            assert all(b.phases["wait"] >= b.phases["poll"] >= 0 for b in r.batches)
    # The commit's critical path was measured on the latency store: a streaming commit is 11 round trips.
    path = report.paths[2]
    assert path.rounds == 11 and 10 <= path.trips <= 13, path
    text = out.getvalue()
    assert "added / (trips x latency)" in text
    assert "| latency | 2 | fleet | " in text
    assert "one streaming commit of P files alone" in text


def test_the_command_line() -> None:
    argv = ["--batches", "5", "--partitions", "1,10", "--stores", "latency", "--sides", "fleet,parquet"]
    opts = parse(argv)
    assert (opts.batches, opts.partitions, opts.stores) == (5, (1, 10), ("latency",))
    assert opts.sides == ("parquet", "fleet")  # in the report's order
    assert opts.p99_ms == 5 * opts.latency_ms
    with pytest.raises(SystemExit):
        parse(["--stores", "s3"])
