"""Preflight: before a job's first write, one probe task checks that the executors can do their part.

A cluster where executors cannot import the package, reach the store or reach
Redis otherwise fails every task of the first action, and Spark retries each
one ``spark.task.maxFailures`` times before the job fails with an error per
task. The probe finds the same problems in one task, and the driver raises one
:class:`~shared.ConfigError` with one line per problem before the job starts.

The probe runs on an executor, as a one-partition action, and checks

- ``package``: ``shared.spark`` and what the writer needs (pyarrow, redis,
  msgspec, the store's SDK) import;
- ``task input``: the writer's killed-attempt check works with this PySpark
  (:mod:`._task_input`);
- ``store``: a probe object can be written and deleted under the job's
  staging prefix (``_staging/<job>/_preflight-<random>``);
- ``redis``: the fleet's Redis answers ``PING``.

It never raises (each failure is a line of its result), so Spark never retries
it. The function shipped to the executor is pickled by value and imports the
package only when it runs, so a missing package is reported as a problem too,
not as a task that cannot even be loaded.
"""

from __future__ import annotations

import importlib
import secrets
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from .._errors import CommitfleetError, ConfigError
from ..settings import masked_url, secret_enc_hook
from ._config import ProducerConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_SDK_OF_SCHEME = {
    "s3": "aiobotocore",
    "gs": "gcloud.aio.storage",
    "az": "azure.storage.blob.aio",
}
_PROBE_TIMEOUT = 60.0


def sdk_modules(store_url: str) -> tuple[str, ...]:
    """Return the modules an executor must import to write to ``store_url`` (pure)."""
    scheme = store_url.split("://", 1)[0]
    sdk = _SDK_OF_SCHEME.get(scheme)
    return ("pyarrow", "pyarrow.parquet", "redis", "msgspec", *((sdk,) if sdk else ()))


def probe_key(job: str) -> str:
    """Return a fresh key for the store probe under ``job``'s staging prefix."""
    return f"_staging/{job}/_preflight-{secrets.token_hex(8)}"


def _line(check: str, exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{check}: {type(exc).__name__}: {text}"[:500]


def check_on_executor(job: str, config: ProducerConfig) -> list[str]:
    """Run every check of the probe here (inside the probe task); return one line per problem.

    Never raises for a failed check; an unexpected error type escapes (a bug,
    which the task's failure then shows).
    """
    problems: list[str] = []
    for module in sdk_modules(config.store_url):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            problems.append(_line(f"package {module}", exc))
    if problems:
        return problems  # the other checks would only fail for the same reason

    from ._task_input import InputState, input_state

    state = input_state()
    if state is not InputState.OPEN:
        import pyspark

        problems.append(
            f"task input: the killed-attempt check found {state.value} instead of open "
            f"(pyspark {pyspark.__version__} is laid out differently); the writer would refuse every task"
        )
    problems.extend(_check_store(job, config))
    problems.extend(_check_redis(config))
    return problems


def _check_store(job: str, config: ProducerConfig) -> list[str]:
    from ._executor_runtime import process_runtime

    key = probe_key(job)
    runtime = process_runtime()
    try:
        store = runtime.store(config.store_url, config.store)
        runtime.run(store.write_if_absent(key, b"commitfleet preflight\n"), timeout=_PROBE_TIMEOUT)
    except (CommitfleetError, OSError, TimeoutError) as exc:
        return [_line(f"store {config.store_url} (write {key})", exc)]
    try:
        runtime.run(store.delete(key), timeout=_PROBE_TIMEOUT)
    except (CommitfleetError, OSError, TimeoutError) as exc:
        return [_line(f"store {config.store_url} (delete {key}; the object is left behind)", exc)]
    return []


def _check_redis(config: ProducerConfig) -> list[str]:
    import redis
    import redis.exceptions

    from ..queue import connect_sync

    # The URL holds no password (ProducerConfig moved it into redis_password).
    shown = masked_url(config.redis_url, has_password=bool(config.redis_password))
    where = f"redis {shown}"
    try:
        # The publisher's own client: a cluster URL gets a cluster client (which connects now).
        client = connect_sync(config.redis_settings)
    except CommitfleetError as exc:
        return [_line(where, exc)]
    try:
        client.ping()
    # A Sentinel URL's client raises ConfigError when no Sentinel knows the service.
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError, CommitfleetError) as exc:
        return [_line(where, exc)]
    finally:
        client.close()
    return []


def _probe_task(job: str, config_doc: dict[str, Any]) -> Any:
    """Return the function the probe task runs, free of references to this package.

    cloudpickle ships a nested function by value; everything it needs from
    ``shared`` it imports when it runs, so an executor without the package
    reports that instead of failing to load the task.
    """

    def run(rows: Iterable[Any]) -> Iterator[list[str]]:
        for _ in rows:
            pass
        try:
            preflight = importlib.import_module("shared.spark._preflight")
            config_mod = importlib.import_module("shared.spark._config")
            conv = importlib.import_module("msgspec").convert
            hook = importlib.import_module("shared.settings").secret_dec_hook
        except ImportError as exc:
            yield [f"package: cannot import commitfleet's shared package on the executor: {exc}"]
            return
        yield preflight.check_on_executor(job, conv(config_doc, config_mod.ProducerConfig, dec_hook=hook))

    return run


def run_preflight(spark: SparkSession, job: str, config: ProducerConfig) -> None:
    """Run the probe on one executor task; return when every check passed.

    Does nothing when ``config.preflight`` is false.

    Raises:
        ConfigError: one or more checks failed; the message has one line per
            problem.
        Whatever the Spark action raises if the probe task itself could not run
        (for example no executor ever came up).

    Blocks for one Spark action (~0.2-1 s, more when it starts the first
    Python worker of an executor, which the job's tasks then reuse).
    """
    if not config.preflight:
        return
    probe = _probe_task(job, msgspec.to_builtins(config, enc_hook=secret_enc_hook))
    results = spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()
    problems = [line for result in results for line in result]
    if problems:
        raise ConfigError(
            f"preflight for job {job} failed on the executors:\n" + "\n".join(f"  {p}" for p in problems)
        )


__all__ = ["check_on_executor", "probe_key", "run_preflight", "sdk_modules"]
