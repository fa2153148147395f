"""The preflight probe's parts that need no JVM: what it imports, and that it ships without the package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import msgspec

from shared.settings import masked_url, secret_enc_hook
from shared.spark import ProducerConfig
from shared.spark._preflight import _probe_task, probe_key, sdk_modules


def test_the_store_sdk_checked_follows_the_store_url() -> None:
    base = ("pyarrow", "pyarrow.parquet", "redis", "msgspec")
    assert sdk_modules("s3://b/p") == (*base, "aiobotocore")
    assert sdk_modules("gs://b/p") == (*base, "gcloud.aio.storage")
    assert sdk_modules("az://c/p") == (*base, "azure.storage.blob.aio")
    assert sdk_modules("file:///x") == base


def test_probe_keys_are_fresh_and_under_the_jobs_staging_prefix() -> None:
    a, b = probe_key("j1"), probe_key("j1")
    assert a != b and a.startswith("_staging/j1/_preflight-") and b.startswith("_staging/j1/_preflight-")


def test_redis_passwords_never_reach_a_problem_line() -> None:
    assert masked_url("redis://user:s3cret@h:6379/0") == "redis://user:**********@h:6379/0"
    assert masked_url("rediss://:s3cret@h/0") == "rediss://:**********@h/0"
    assert masked_url("redis://h:6379/0") == "redis://h:6379/0"


def test_the_probe_ships_by_value_and_reports_an_executor_without_the_package(tmp_path: Path) -> None:
    """Pickled as Spark ships it, loaded where ``shared`` cannot be imported: one 'package' line, no crash."""
    from pyspark import cloudpickle

    cfg = ProducerConfig(redis_url="redis://127.0.0.1:1/0", store_url="file:///nowhere", shards=1)
    data = cloudpickle.dumps(_probe_task("j1", msgspec.to_builtins(cfg, enc_hook=secret_enc_hook)))
    (tmp_path / "probe.pkl").write_bytes(data)
    site = str(Path(msgspec.__file__).parent.parent)  # pyspark and msgspec, without the editable finder
    code = (
        "import importlib.util, pickle, sys; sys.path.append(sys.argv[2]);"
        "assert importlib.util.find_spec('shared') is None, 'shared must not be importable here';"
        "probe = pickle.loads(open(sys.argv[1], 'rb').read());"
        "print(repr(list(probe(iter([0])))))"
    )
    run = subprocess.run(
        [sys.executable, "-S", "-c", code, str(tmp_path / "probe.pkl"), site],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    (lines,) = ast.literal_eval(run.stdout)  # one result: the list of problem lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("package: cannot import commitfleet's shared package"), lines
