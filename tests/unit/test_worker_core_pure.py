"""The worker's core (``workers/_core``) stays pure: no asyncio, no Redis, no store, no clock.

Each module's source is read and its AST walked: an import of a forbidden
module (or of anything under it), and a use of a clock (``time.monotonic()``,
``datetime.now()``, ``loop.time()``, ...) even through an alias, fail the test.
Where a decision needs "now", it takes it as an argument. The synthetic cases
below show the check does catch each kind.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import workers._core

CORE = Path(workers._core.__file__).parent
MODULES = sorted(CORE.glob("*.py"))

# A module of the core may import none of these, nor anything under them.
FORBIDDEN_IMPORTS = ("asyncio", "redis", "shared.storage", "time", "datetime", "trio", "anyio")
# Attribute calls that read a clock, whatever the name of the object they are called on
# (``loop.time()``, ``asyncio.get_running_loop().time()``, an aliased ``time`` module).
CLOCK_ATTRIBUTES = frozenset(
    {
        "time",
        "monotonic",
        "monotonic_ns",
        "perf_counter",
        "perf_counter_ns",
        "time_ns",
        "process_time",
        "now",
        "utcnow",
        "today",
        "fromtimestamp",
    }
)


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f"{f}.") for f in FORBIDDEN_IMPORTS)


def impurities(source: str, filename: str = "<core>") -> list[str]:
    """Return what makes ``source`` impure: each forbidden import and clock read, with its line."""
    tree = ast.parse(source, filename)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and _forbidden(module):
                found.append(f"{node.lineno}: from {module} import ...")
            elif node.level == 0:
                # ``from shared import storage``, ``from redis import asyncio``: a forbidden module by name.
                found += [
                    f"{node.lineno}: from {module} import {a.name}"
                    for a in node.names
                    if _forbidden(f"{module}.{a.name}")
                ]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in CLOCK_ATTRIBUTES:
                found.append(f"{node.lineno}: calls .{func.attr}()")
    # A clock passed on without a call (``clock = time.monotonic``) is a read waiting to happen.
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in CLOCK_ATTRIBUTES
            and isinstance(node.value, ast.Name)
            and node.value.id in {"time", "datetime", "loop", "asyncio"}
        ):
            found.append(f"{node.lineno}: uses {node.value.id}.{node.attr}")
    return found


def test_the_core_has_modules() -> None:
    names = {m.stem for m in MODULES}
    assert {"_decide", "_jobstate", "_tally", "_work", "_work_queue", "_liveness"} <= names


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_a_core_module_imports_no_io_and_reads_no_clock(module: Path) -> None:
    assert impurities(module.read_text(), str(module)) == []


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("import asyncio\n", "import asyncio"),
        ("import asyncio.locks as locks\n", "import asyncio.locks"),
        ("from asyncio import Event\n", "from asyncio import"),
        ("import redis.asyncio\n", "import redis.asyncio"),
        ("from redis import asyncio as aioredis\n", "from redis import"),
        ("from shared.storage import ObjectStore\n", "from shared.storage import"),
        ("from shared import storage\n", "from shared import storage"),
        ("from shared.storage._local import LocalStore\n", "from shared.storage._local import"),
        ("import time\n", "import time"),
        ("from time import monotonic\n", "from time import"),
        ("import datetime\n", "import datetime"),
        ("def f(loop):\n    return loop.time()\n", "calls .time()"),
        ("def f(t):\n    return t.monotonic()\n", "calls .monotonic()"),
        ("def f(dt):\n    return dt.datetime.now()\n", "calls .now()"),
        ("def f(time):\n    clock = time.monotonic\n    return clock\n", "uses time.monotonic"),
    ],
)
def test_the_check_catches_an_impure_module(source: str, what: str) -> None:
    found = impurities(source)
    assert found and any(what in f for f in found), found


def test_the_check_passes_a_pure_module() -> None:
    source = (
        "from __future__ import annotations\n"
        "import msgspec\n"
        "from shared.events import TaskFinished\n"
        "from ._jobstate import ShardJobs\n"
        "def deadline(now: float, timeout: float) -> float:\n"
        "    return now + timeout\n"
    )
    assert impurities(source) == []
