# The two commands of the README: `make demo` and `make test`.
.PHONY: demo test lint typecheck check stress chaos streaming traces spark-acl bench bootstrap schema spark-cluster redis-cluster redis-ha k8s-manifests

VENV := .venv/bin

bootstrap:
	@bash scripts/bootstrap.sh

demo: bootstrap
	$(VENV)/commitfleet demo

lint: bootstrap
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	$(VENV)/lint-imports

typecheck: bootstrap
	$(VENV)/mypy

test: bootstrap lint typecheck
	$(VENV)/pytest -q

stress: bootstrap
	$(VENV)/pytest -q -m stress

chaos: bootstrap
	$(VENV)/pytest -q -m chaos

# Structured Streaming drivers SIGKILLed at every crash point and restarted from their checkpoint.
streaming: bootstrap
	$(VENV)/pytest -q -m streaming

# A real Spark standalone cluster (master + 2 workers from the installed pyspark) and spark-submit.
spark-cluster: bootstrap
	$(VENV)/pytest -q -m spark_cluster tests/e2e/test_spark_cluster.py

# The multi-process fleet, a master failover and the Spark e2e test on a local 3+3 Redis Cluster.
redis-cluster: bootstrap
	$(VENV)/pytest -q -m redis_cluster

# Real Sentinel failovers (a master, 2 replicas, 3 Sentinels): SIGKILL and SIGSTOP of the master under
# a committing fleet and a Spark job, with wait_replicas 1 and 0.
redis-ha: bootstrap
	$(VENV)/pytest -q -m ha

# A real Spark job (local mode) publishing under the producer's minimal ACL (tests/e2e/test_spark_acl.py).
spark-acl: bootstrap
	$(VENV)/pytest -q -m spark_acl

# A real PySpark driver's span and the fleet's spans under it (tests/e2e/test_tracing_spark.py).
traces: bootstrap
	$(VENV)/pytest -q -m traces

bench: bootstrap
	$(VENV)/commitfleet bench

schema: bootstrap
	$(VENV)/python -m shared.events --write

# The Helm chart (docker/helm/commitfleet) rendered by Helm's engine for the default values and each preset,
# validated against the Kubernetes schemas, written to a new folder whose path is printed (DIR=... to choose).
k8s-manifests: bootstrap
	@$(VENV)/python -m tests._support.helm_render $(DIR)
