"""A process's memory, as the benchmarks measure it."""

from __future__ import annotations

from pathlib import Path


def rss_mb(pid: int) -> float:
    """Return the resident set size of ``pid`` in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
