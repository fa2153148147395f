"""Test-wide pytest plugins: fixtures shared by every test folder."""

pytest_plugins = [
    "tests._support.emulators",
    "tests._support.redis_server",
    "tests._support.redis_cluster",
    "tests._support.redis_sentinel",
]
