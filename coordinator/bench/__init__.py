"""``commitfleet bench``: intake (``_intake``, against the raw stream rate of ``_raw``), commit
(``_commit``: the workload and the in-process modes; ``_fleet``: the fleet mode and the report),
cluster (``_cluster``), each durability level against ``memory`` (``_durability``) and the
throwaway S3 server (``_s3``).

The names are imported when first used (PEP 562): ``bench intake`` does not load
the commit core, nor ``bench commit`` the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared import lazy_exports

if TYPE_CHECKING:
    from ._cluster import run_cluster_bench
    from ._commit import MODES, Workload, open_raw, stage, verify
    from ._durability import parse_levels, run_durability_bench
    from ._fleet import model_p50, run_commit_bench
    from ._intake import run_bench
    from ._raw import raw_consume_rate
    from ._s3 import s3_emulator

_WHERE = {
    "run_cluster_bench": "._cluster",
    **dict.fromkeys(("MODES", "Workload", "open_raw", "stage", "verify"), "._commit"),
    "parse_levels": "._durability",
    "run_durability_bench": "._durability",
    "model_p50": "._fleet",
    "run_commit_bench": "._fleet",
    "run_bench": "._intake",
    "raw_consume_rate": "._raw",
    "s3_emulator": "._s3",
}

__getattr__ = lazy_exports(__name__, _WHERE)


__all__ = [
    "MODES",
    "Workload",
    "model_p50",
    "open_raw",
    "parse_levels",
    "raw_consume_rate",
    "run_bench",
    "run_cluster_bench",
    "run_commit_bench",
    "run_durability_bench",
    "s3_emulator",
    "stage",
    "verify",
]
