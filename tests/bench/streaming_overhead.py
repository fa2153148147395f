"""Per micro-batch overhead of a Structured Streaming query committed through a fleet (a script, not a test).

    .venv/bin/python -m tests.bench.streaming_overhead --partitions 1,10,100 --stores local,latency

What it runs and measures: tests/_support/streaming_bench.py (shared with its test at a tiny size,
tests/integration/test_bench_streaming.py); the figures: docs/benchmarks.md.
"""

from __future__ import annotations

from tests._support.streaming_bench import main

if __name__ == "__main__":
    main()
