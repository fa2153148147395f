"""Commits per minute and their latency over the last hour, from the admin stream's ``committed`` events."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

WINDOW_MINUTES: Final = 60


@dataclass(slots=True)
class _Minute:
    minute: int  # minutes since the epoch
    commits: int = 0
    seconds: float = 0.0
    max_s: float = 0.0


class CommitHistory:
    """A ring of per-minute commit counts and latencies (the last :data:`WINDOW_MINUTES`)."""

    def __init__(self) -> None:
        self._minutes: dict[int, _Minute] = {}
        self._newest = 0  # the newest minute seen

    def add(self, at: float, duration_s: float) -> None:
        """Count one commit that ended at ``at`` (epoch seconds) after ``duration_s`` seconds."""
        m = int(at // 60)
        slot = self._minutes.get(m)
        if slot is None:
            newest = max(m, self._newest)
            if m <= newest - WINDOW_MINUTES:
                return  # already out of the window (events may arrive out of order)
            self._newest = newest
            slot = self._minutes[m] = _Minute(m)
            # Forget what fell out of the window: the dict stays bounded.
            for old in [k for k in self._minutes if k <= newest - WINDOW_MINUTES]:
                del self._minutes[old]
        slot.commits += 1
        slot.seconds += duration_s
        slot.max_s = max(slot.max_s, duration_s)

    def series(self, now: float) -> dict[str, Any]:
        """Return the last hour, one point per minute, oldest first.

        Each point: ``t`` (the minute's start, epoch seconds), ``commits``,
        ``per_s`` (commits per second over that minute), ``mean_s`` and
        ``max_s`` (commit latency; None without commits).
        """
        end = int(now // 60)
        points: list[dict[str, Any]] = []
        for m in range(end - WINDOW_MINUTES + 1, end + 1):
            slot = self._minutes.get(m)
            n = slot.commits if slot else 0
            points.append(
                {
                    "t": m * 60,
                    "commits": n,
                    "per_s": round(n / 60, 4),
                    "mean_s": round(slot.seconds / n, 4) if slot and n else None,
                    "max_s": round(slot.max_s, 4) if slot and n else None,
                }
            )
        total = sum(int(p["commits"]) for p in points)
        return {"window_s": WINDOW_MINUTES * 60, "commits": total, "points": points}


def window_start_id(now: float) -> str:
    """Return the admin stream id at which the history window starts (ids begin with milliseconds)."""
    return f"{math.floor((now - WINDOW_MINUTES * 60) * 1000)}-0"
