"""``commitfleet pack``: the zip executors import commitfleet from, checked by importing from it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from shared.spark._pack import build_pack, package_root, spark_requirements


def test_the_pack_holds_the_shared_package_and_nothing_else_and_is_reproducible(tmp_path: Path) -> None:
    first = build_pack(tmp_path / "a")
    (package_root() / "spark" / "__pycache__").mkdir(exist_ok=True)  # caches never go in
    second = build_pack(tmp_path / "b")
    assert first.archive.read_bytes() == second.archive.read_bytes()
    assert first.sha256 == second.sha256
    names = zipfile.ZipFile(first.archive).namelist()
    assert names == sorted(names)
    assert {n.split("/")[0] for n in names} == {"shared"}
    for needed in (
        "shared/__init__.py",
        "shared/py.typed",
        "shared/spark/_writer.py",
        "shared/spark/_preflight.py",
        "shared/schema/queue-events.schema.json",
    ):
        assert needed in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert len(names) == first.files
    assert first.requirements.read_text().splitlines() == spark_requirements()
    assert {"pyarrow>=14", "msgspec>=0.18"} <= set(spark_requirements())
    assert any(r.startswith("redis") for r in spark_requirements())


def test_a_python_without_the_checkout_imports_the_producer_from_the_pack(tmp_path: Path) -> None:
    p = build_pack(tmp_path / "dist")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import shared, shared.spark, shared.spark._writer; from shared import load_settings;"
        "print(shared.__file__); print(shared.spark.commit_job.__module__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-c", code, str(p.archive)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    where, module = run.stdout.split()
    assert where.startswith(str(p.archive) + os.sep)
    assert module == "shared.spark._job"


def test_the_cli_command_writes_the_pack(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "coordinator", "pack", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    archives = list((tmp_path / "out").glob("commitfleet-*-shared.zip"))
    assert len(archives) == 1
    assert f"--py-files {archives[0]}" in run.stdout
    assert (tmp_path / "out" / "requirements-spark.txt").is_file()
