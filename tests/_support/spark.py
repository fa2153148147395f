"""A module-scoped local SparkSession for tests (one JVM per test module: ~6-12 s to start).

Usage in a test module::

    from tests._support.spark import spark_session_fixture

    spark = spark_session_fixture("test-spark-producer", master="local[2,2]")

    @pytest.mark.spark
    def test_something(spark): ...

The session is stopped at the end of the module, and the process's cached Redis
publishers are closed with it, so the next module starts clean.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_session_fixture(
    app_name: str, *, master: str = "local[2,2]", extra_conf: Mapping[str, Any] | None = None
) -> Callable[..., Any]:
    """Return a module-scoped pytest fixture that yields a local SparkSession.

    The default master ``local[2,2]`` has two slots and two attempts per task,
    so a task that fails once is retried.
    """

    @pytest.fixture(scope="module")
    def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
        from shared.queue import SyncPublisher
        from shared.spark import local_spark_session

        session = local_spark_session(
            app_name, master=master, extra_conf=extra_conf, tmp_dir=tmp_path_factory.mktemp("spark")
        )
        session.sparkContext.setLogLevel("ERROR")
        try:
            yield session
        finally:
            session.stop()
            SyncPublisher.close_cached()

    return spark


__all__ = ["spark_session_fixture"]
