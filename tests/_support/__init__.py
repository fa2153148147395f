"""The one home of test scaffolding: fleets, fault stores, checkpoint gates, routing, Redis and emulators.

Test modules (and the benchmark scripts in tests/bench) import shared helpers
from here, and fixtures from ``conftest.py``; no module of tests/ imports a test
module (tests/unit/test_test_layout.py checks it). Where to look:

- an in-process fleet: ``fleet`` (``inprocess_fleet``, ``fleet_settings``);
  real processes: ``processes``, ``process_fleet``; the CLI: ``cli``;
- synthetic jobs and the checks on a fleet's outcome: ``fleet_jobs``, ``fleet_checks``;
- a dataset on shard N: ``routing``; a worker held at a checkpoint: ``checkpoints``;
- a store that fails on purpose: ``fault_store``; commit-core and lock helpers:
  ``commit``, ``locks``, ``shard_state``, ``tables``, ``uploads``;
- Redis, emulators, Spark: ``redis_server``, ``redis_cluster``, ``redis_monitor``,
  ``emulators``, ``spark``, ``spark_cluster``, ``spark_fleet``.
"""
