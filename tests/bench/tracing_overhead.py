"""Tracing's overhead on intake and on the commit core: off and on, alternated in one run (a script).

Each round measures, in an order that alternates (off first in odd rounds, on
first in even ones):

- **intake**: ``commitfleet bench intake``'s measurement (one worker, one
  shard, ``--events`` task_finished events after a ``job_started``), the
  worker tracing or not (``tracing.enabled``; on, the ``job_started``
  carries a producer context, so its intake span is recorded);
- **commit**: ``commitfleet bench commit``'s ``core`` mode (``--datasets``
  datasets of ``--files`` files, lock -> commit -> release, ``--inflight`` at
  a time) on local files (``--latency-ms``: with a modelled cloud store's
  round trip), the same spans recorded as a worker records (the commit, its
  lock wait, its phases).

With tracing on, the spans go through the SDK's batch processor and the
OTLP/HTTP exporter to a stand-in collector on a loopback port, in a process of
its own (so the export's serialisation runs here, in its thread, as in
production, and the collector's work does not). Prints each
round and the median of the per-round ratios on / off::

    .venv/bin/python -m tests.bench.tracing_overhead --rounds 5 --events 20000 --datasets 200
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from coordinator.bench._commit import Workload, open_raw, run_core, timed_inprocess
from coordinator.bench._intake import _bench_settings, measure_intake_cpu
from coordinator.demo import ThrowawayRedis
from shared import Settings, load_settings
from shared.events import TraceContext
from shared.settings import TracingSettings
from shared.storage import open_store
from shared.tracing import NO_TRACER, Tracer, open_tracer

PRODUCER = TraceContext(traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")


def _commit_settings(root: Path, latency_ms: float) -> Settings:
    store: dict[str, object] = {"url": root.as_uri()}
    if latency_ms:
        store.update(model_latency_ms=latency_ms, model_latency_p99_ms=latency_ms * 4)
    return load_settings(env={}, overrides={"store": store, "log": {"level": "WARNING"}})


async def intake_round(url: str, root: Path, events: int, on: bool) -> tuple[float, float]:
    """Return (events/s, CPU us/event) of one intake measurement on a fresh fleet."""
    s = _bench_settings(url, root)
    if on:
        s = load_settings(env={}, overrides={**_as_overrides(s), "tracing": {"enabled": True}})
    return await measure_intake_cpu(s, events, trace=PRODUCER if on else None)


def _as_overrides(s: Settings) -> dict[str, dict[str, object]]:
    return {
        "fleet": {"name": s.fleet.name, "shards": s.fleet.shards},
        "redis": {"url": s.redis.url},
        "store": {"url": s.store.url},
        "worker": {"lease": 6.0, "heartbeat": 1.0, "read_block_ms": 100, "read_batch": 500},
        "coordinator": {"tick": 0.1, "http_port": 0},
        "log": {"level": "WARNING", "format": "text"},
    }


async def commit_round(
    root: Path, w: Workload, inflight: int, tracer: Tracer, latency_ms: float = 0.0
) -> tuple[float, float]:
    """Return (datasets/s, CPU ms/dataset) of one core-mode commit run (``latency_ms``: the store's)."""
    settings = _commit_settings(root, latency_ms)
    async with open_store(settings.store.url, settings.store) as store, open_raw(settings) as raw:
        res = await timed_inprocess(
            "core", store, raw, w, lambda s, ws: run_core(s, settings, w, ws, inflight, tracer=tracer)
        )
    return res.rate, (res.cpu_seconds or 0.0) / w.datasets * 1e3


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="tracing-overhead-"))
    collector = subprocess.Popen(
        [sys.executable, "-m", "tests._support.otlp_collector"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert collector.stdout is not None
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.stdout.readline().strip()
        os.environ.setdefault("OTEL_SERVICE_NAME", "tracing-overhead-bench")
        server = ThrowawayRedis(work)
        try:
            figures: dict[str, dict[bool, list[float]]] = {
                k: {False: [], True: []} for k in ("intake", "intake_cpu", "commit", "commit_cpu")
            }
            ratios: dict[str, list[float]] = {"intake": [], "commit": []}
            for i in range(args.rounds):
                order = (False, True) if i % 2 == 0 else (True, False)
                got: dict[tuple[str, bool], tuple[float, float]] = {}
                for on in order:
                    got["intake", on] = await intake_round(server.url, work / f"i{i}{on}", args.events, on)
                for on in order:
                    tracer = open_tracer(TracingSettings(enabled=on), service="bench") if on else NO_TRACER
                    w = Workload(datasets=args.datasets, files=args.files, size=args.size)
                    try:
                        got["commit", on] = await commit_round(
                            work / f"c{i}{on}", w, args.inflight, tracer, args.latency_ms
                        )
                    finally:
                        await asyncio.to_thread(tracer.close)
                for kind in ("intake", "commit"):
                    for on in (False, True):
                        rate, cpu = got[kind, on]
                        figures[kind][on].append(rate)
                        figures[f"{kind}_cpu"][on].append(cpu)
                    ratios[kind].append(got[kind, True][0] / got[kind, False][0])
                print(
                    f"round {i + 1}: intake off {got['intake', False][0]:,.0f} ev/s "
                    f"({got['intake', False][1]:.1f} us/ev), on {got['intake', True][0]:,.0f} ev/s "
                    f"({got['intake', True][1]:.1f} us/ev), ratio {ratios['intake'][-1]:.3f}; "
                    f"commit off {got['commit', False][0]:,.1f} ds/s "
                    f"({got['commit', False][1]:.2f} ms CPU/ds), "
                    f"on {got['commit', True][0]:,.1f} ds/s ({got['commit', True][1]:.2f} ms CPU/ds), "
                    f"ratio {ratios['commit'][-1]:.3f}",
                    flush=True,
                )
            for kind, unit in (("intake", "ev/s"), ("commit", "ds/s")):
                off, on = statistics.median(figures[kind][False]), statistics.median(figures[kind][True])
                coff = statistics.median(figures[f"{kind}_cpu"][False])
                con = statistics.median(figures[f"{kind}_cpu"][True])
                print(
                    f"{kind}: median off {off:,.1f} {unit}, on {on:,.1f} {unit}; median of per-round ratios "
                    f"on/off {statistics.median(ratios[kind]):.3f}; "
                    f"CPU per item off {coff:.2f}, on {con:.2f} (ratio {con / coff:.3f})"
                )
        finally:
            server.stop()
    finally:
        collector.terminate()
        out, _ = collector.communicate(timeout=30)
        print(f"spans received by the collector: {out.strip()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--datasets", type=int, default=200)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="modelled store latency (median; p99 4x)"
    )
    asyncio.run(main(parser.parse_args()))
