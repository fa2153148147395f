"""A local-mode SparkSession with settings that make it start fast and stay offline.

Why each setting (measured on the project's 2-core machines, see FIELD-NOTES):

- no UI, no console progress bar: less start-up work, no port to bind, clean logs;
- small shuffle partitions / default parallelism: local jobs are small, and every
  partition is a task (~30 ms each);
- driver host and bind address 127.0.0.1 (and ``SPARK_LOCAL_IP``): never resolve
  the machine's hostname, never listen on a public interface;
- ``spark.local.dir`` (and the warehouse / Derby home) inside a temp folder: no
  ``spark-warehouse`` or ``metastore_db`` litter in the working directory;
- ``-XX:TieredStopAtLevel=1`` (C1 JIT only): 1.5-3 s faster start;
- ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` = the running interpreter, so
  executors import the same packages as the driver;
- ``spark.jars.packages`` is never set: nothing is ever downloaded.

``master="local[N,F]"`` gives N slots and F attempts per task (``local[2,2]``: a
task that fails once is retried once), which the fault-injection tests use.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_FORBIDDEN_CONF = ("spark.jars.packages", "spark.jars.repositories", "spark.jars.ivySettings")


def local_session_conf(app_name: str, *, master: str, local_dir: Path) -> dict[str, str]:
    """Return the Spark configuration :func:`local_spark_session` uses (pure).

    ``local_dir`` is the scratch folder for shuffle files, the warehouse and
    Derby; the JVM's ``java.io.tmpdir`` points there too.
    """
    java_opts = f"-XX:TieredStopAtLevel=1 -Djava.io.tmpdir={local_dir} -Dderby.system.home={local_dir}"
    return {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.local.dir": str(local_dir),
        "spark.sql.warehouse.dir": str(local_dir / "warehouse"),
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.sql.session.timeZone": "UTC",
    }


def local_spark_session(
    app_name: str,
    *,
    master: str = "local[2]",
    extra_conf: Mapping[str, Any] | None = None,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> SparkSession:
    """Start (or return the running) local-mode SparkSession, offline and fast.

    ``extra_conf`` entries win over the defaults, except that jar downloads
    (``spark.jars.packages`` and friends) are refused. ``tmp_dir`` holds Spark's
    scratch files; without it a temp folder is made and removed at interpreter
    exit. Sets ``PYSPARK_PYTHON``, ``PYSPARK_DRIVER_PYTHON`` (to
    ``sys.executable``) and ``SPARK_LOCAL_IP`` (unless already set) in this
    process's environment, because the JVM and the Python workers it launches
    read them from there.

    Returns:
        The SparkSession (``getOrCreate``: if one is already running in this
        process, it is returned and static settings are not changed).

    Raises:
        ConfigError: ``extra_conf`` asks for jars to be fetched, or
            ``master`` is not a ``local`` master.

    Blocks for the JVM start (~6-12 s); not cancellable midway.
    """
    if not master.startswith("local"):
        raise ConfigError(f"local_spark_session only starts local masters, not {master!r}")
    extra = {k: str(v) for k, v in (extra_conf or {}).items()}
    for key in _FORBIDDEN_CONF:
        if key in extra:
            raise ConfigError(f"{key} would download jars; commitfleet never fetches jars")
    if tmp_dir is None:
        local_dir = Path(tempfile.mkdtemp(prefix="commitfleet-spark-"))
        atexit.register(shutil.rmtree, local_dir, True)
    else:
        local_dir = Path(tmp_dir).absolute()
        local_dir.mkdir(parents=True, exist_ok=True)

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in {**local_session_conf(app_name, master=master, local_dir=local_dir), **extra}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


__all__ = ["local_session_conf", "local_spark_session"]
