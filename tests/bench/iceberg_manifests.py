"""Our Iceberg manifest and manifest list writers against pyiceberg's (a script, not a test).

A fast append writes one manifest of the commit's data files, then a
manifest list of it and the previous snapshot's manifests. Times both, for
``--files`` data files with statistics on 10 columns, and a previous list of
each ``--previous`` size (written by pyiceberg, as a table's commits by
pyiceberg leave it, and by us), on local files::

    .venv/bin/python -m tests.bench.iceberg_manifests --repeat 50

Prints the median time of each writer and the ratio pyiceberg / ours.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, ManifestFile

from shared.commit._iceberg_manifests import write_manifest, write_manifest_list
from tests._support.manifest_files import (
    SPECS,
    WIDE_SCHEMA,
    FileShape,
    pyiceberg_manifest,
    pyiceberg_manifest_list,
    random_data_file,
)

SNAPSHOT = 9_000_000_000_000_000


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _previous_lists(
    io: PyArrowFileIO, d: Path, n: int, files: list[DataFile], spec_name: str, codec: str
) -> tuple[str, str]:
    """Write a previous list of ``n`` manifests, each of its own earlier snapshot, by pyiceberg and by us."""
    olds: list[ManifestFile] = []
    for i in range(n):
        m = write_manifest(
            io.new_output(f"{d}/old-{i}.avro"),
            format_version=2,
            spec=SPECS[spec_name],
            schema=WIDE_SCHEMA,
            snapshot_id=i + 1,
            data_files=files[:1],
            compression=codec,
        )
        m.sequence_number = m.min_sequence_number = i + 1
        olds.append(m)
    head = {"format_version": 2, "snapshot_id": n, "parent_snapshot_id": n - 1, "sequence_number": n}
    theirs, ours = f"{d}/prev-{n}-p.avro", f"{d}/prev-{n}-o.avro"
    pyiceberg_manifest_list(io, theirs, **head, new_manifests=olds[::-1], previous=None, compression=codec)
    write_manifest_list(
        io.new_output(ours), **head, new_manifests=olds[::-1], previous=None, io=io, compression=codec
    )
    return theirs, ours


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--previous", type=int, nargs="*", default=[1, 50, 500])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--compression", default="gzip")
    ap.add_argument("--spec", default="identity-date", choices=sorted(SPECS))
    args = ap.parse_args()
    rng = random.Random(7)
    spec = SPECS[args.spec]
    io = PyArrowFileIO()
    codec = args.compression
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        files = [
            random_data_file(i, WIDE_SCHEMA, spec, rng, FileShape(columns=10)) for i in range(args.files)
        ]
        common = {"format_version": 2, "spec": spec, "schema": WIDE_SCHEMA, "snapshot_id": SNAPSHOT}
        theirs_m = partial(
            pyiceberg_manifest, io, f"{d}/m-p.avro", **common, data_files=files, compression=codec
        )
        ours_m = partial(
            write_manifest, io.new_output(f"{d}/m-o.avro"), **common, data_files=files, compression=codec
        )
        p = _median_ms(theirs_m, args.repeat)
        o = _median_ms(ours_m, args.repeat)
        print(
            f"manifest, {args.files} files x 10 columns: pyiceberg {p:.2f} ms, ours {o:.2f} ms ({p / o:.1f}x)"
        )
        new = ours_m()
        for n in args.previous:
            prev_p, prev_o = _previous_lists(io, d, n, files, args.spec, codec)
            head = {
                "format_version": 2,
                "snapshot_id": SNAPSHOT,
                "parent_snapshot_id": n,
                "sequence_number": n + 1,
            }
            lists = {**head, "new_manifests": [new], "compression": codec}
            theirs = partial(pyiceberg_manifest_list, io, f"{d}/l-p.avro", **lists, previous=prev_p)
            p = _median_ms(theirs, args.repeat)
            ours = partial(write_manifest_list, io.new_output(f"{d}/l-o.avro"), **lists, io=io)
            o_p = _median_ms(partial(ours, previous=prev_p), args.repeat)
            o_o = _median_ms(partial(ours, previous=prev_o), args.repeat)
            print(
                f"manifest list, previous {n}: pyiceberg {p:.2f} ms; ours on pyiceberg's previous "
                f"{o_p:.2f} ms ({p / o_p:.1f}x), on ours {o_o:.2f} ms ({p / o_o:.1f}x)"
            )


if __name__ == "__main__":
    main()
