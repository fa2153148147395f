"""Packaging: Spark is an extra, and no command imports Spark, Arrow or a cloud SDK before it needs one."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from shared.spark._pack import spark_requirements

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
HEAVY = {"pyspark", "py4j", "pyarrow", "boto3", "botocore", "aiobotocore", "azure", "google", "gcloud"}
# Each command, and the modules its body imports (lazily, once it runs).
COMMANDS = {
    "worker": ["workers"],
    "coordinator": ["coordinator._coordinator"],
    "events": ["coordinator.cli._ops_run"],
    "status": ["coordinator.admin._status", "coordinator.cli._status_text"],
    "retry": ["coordinator.cli._ops_run"],
    "skip": ["coordinator.cli._ops_run"],
    "wait": ["coordinator.cli._wait"],
    "audit": ["coordinator.cli._ops_run"],
    "schema": ["shared.events"],
    "demo": ["coordinator.demo._demo", "coordinator.demo._launcher"],
    "bench": ["coordinator.bench._intake", "coordinator.bench._commit", "coordinator.bench._fleet"],
    "pack": ["shared.spark._pack"],
}


def _name(req: str) -> str:
    return req.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()


def test_pyspark_and_pyarrow_are_the_spark_extra_only() -> None:
    project = PYPROJECT["project"]
    base = {_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert not base & {"pyspark", "pyarrow"}, base
    assert {"pyspark", "pyarrow"} <= {_name(r) for r in extras["spark"]}
    own = [r for r in extras["test"] if r.startswith("commitfleet[")]
    assert own and "spark" in own[0].partition("[")[2].rstrip("]").split(","), extras["test"]
    # An executor's requirements: the extra without pyspark (the cluster's Spark provides it).
    executor = {_name(r) for r in spark_requirements()}
    assert "pyarrow" in executor and "pyspark" not in executor


def test_no_command_imports_spark_arrow_or_a_cloud_sdk_before_it_runs() -> None:
    code = f"""
import importlib, json, sys
from coordinator.cli import app
def heavy():
    return sorted({{m for m in sys.modules if m.split(".")[0] in {sorted(HEAVY)!r}}})
report = {{"--help": None}}
try:
    app(["--help"])
except SystemExit:
    pass
report["--help"] = heavy()
for cmd, modules in {COMMANDS!r}.items():
    try:
        app([cmd, "--help"])
    except SystemExit:
        pass
    for m in modules:
        importlib.import_module(m)
    report[cmd] = heavy()
print("REPORT " + json.dumps(report))
"""
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(res.stdout.split("REPORT ", 1)[1])
    assert set(report) == {"--help", *COMMANDS}
    assert {cmd: mods for cmd, mods in report.items() if mods} == {}
