"""What job liveness costs Redis per running job (a script, not a test).

Starts a private redis-server, runs the driver's real heartbeat
(:class:`shared.spark._outcome.Heartbeat`) for one job over ``--datasets``
datasets on a fleet of ``--shards`` shards for ``--beats`` beats, and reads
Redis's own counters (``INFO stats``/``commandstats``) before and after::

    .venv/bin/python -m tests.bench.heartbeat_cost --job-timeout 300 --datasets 20 --beats 50

The beat interval is ``heartbeat_interval(job_timeout)`` (30 s at 300 s); the
script beats back to back and reports the per-beat cost scaled to the
real interval. The worker's side is
one MGET per shard per tick (1 s) for all the shard's open jobs; its size
grows by one key per job.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import redis

from shared.queue import ensure_fleet_sync, heartbeat_interval, job_shards
from shared.spark import ProducerConfig
from shared.spark._outcome import Heartbeat
from tests._support.redis_server import RedisServer


def _stats(client: redis.Redis) -> tuple[int, int, int]:
    info = client.info("stats")
    return (
        int(info["total_commands_processed"]),
        int(info["total_net_input_bytes"]),
        int(info["total_net_output_bytes"]),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--job-timeout", type=float, default=300.0)
    ap.add_argument("--datasets", type=int, default=20)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--beats", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        try:
            client = redis.Redis.from_url(server.url)
            ensure_fleet_sync(client, "bench", args.shards)
            cfg = ProducerConfig(
                redis_url=server.url,
                store_url=Path(tmp).as_uri(),
                fleet="bench",
                shards=args.shards,
                job_timeout=args.job_timeout,
            )
            datasets = [f"dataset{i}" for i in range(args.datasets)]
            shards = len(job_shards(datasets, args.shards))
            # As in commit_job: each beat also reads the job's result records.
            hb = Heartbeat(cfg, "bench-job", datasets, on_beat=lambda _outcome: None)
            before = _stats(client)
            hb._beat()
            for _ in range(args.beats - 1):
                hb._beat()
            after = _stats(client)
            cmds, inb, outb = (a - b for a, b in zip(after, before, strict=True))
            cmds -= 2  # the two INFO calls
            per_beat = (cmds / args.beats, inb / args.beats, outb / args.beats)
            interval = heartbeat_interval(args.job_timeout)
            memory = client.memory_usage(cfg_keys(cfg, datasets)[0]) or 0
            print(
                f"job over {args.datasets} datasets on {shards} of {args.shards} shards, "
                f"job_timeout {args.job_timeout:g}s, beat every {interval:g}s\n"
                f"per beat: {per_beat[0]:.1f} commands, {per_beat[1]:.0f} B in, {per_beat[2]:.0f} B out "
                f"(one pipelined round trip for the SETs, one for the result reads)\n"
                f"per second: {per_beat[0] / interval:.3f} commands/s, "
                f"{(per_beat[1] + per_beat[2]) / interval:.0f} B/s\n"
                f"memory: {memory} B per liveness key, {shards} keys"
            )
            client.close()
        finally:
            server.kill()


def cfg_keys(cfg: ProducerConfig, datasets: list[str]) -> list[str]:
    from shared.queue import Keys

    assert cfg.shards is not None
    return [Keys(cfg.fleet).job_alive(s, "bench-job") for s in job_shards(datasets, cfg.shards)]


if __name__ == "__main__":
    main()
