"""Zero import cycles between product modules, counting ``if TYPE_CHECKING:`` imports.

`lint-imports` (pyproject.toml) checks the layers between rooms; this checks every
module against every other, inside a room too: a cycle closed by a type-checking
import is still two modules that know each other's insides.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import grimp
import pytest

ROOTS = ("shared", "workers", "coordinator")


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, sorted(graph.find_modules_directly_imported_by(start))))
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.find_modules_directly_imported_by(nxt))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_product_has_no_import_cycle() -> None:
    graph = grimp.build_graph(*ROOTS, cache_dir=None, exclude_type_checking_imports=False)
    assert cycles(graph) == []


def test_a_type_checking_cycle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check fails on a cycle closed only by an ``if TYPE_CHECKING:`` import."""
    pkg = tmp_path / "cyclic_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_a.py").write_text("from ._b import B\n\nclass A: ...\n")
    (pkg / "_b.py").write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from ._a import A
            class B: ...
            """
        )
    )
    (pkg / "_c.py").write_text("from ._a import A\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        graph = grimp.build_graph("cyclic_pkg", cache_dir=None, exclude_type_checking_imports=False)
    finally:
        sys.modules.pop("cyclic_pkg", None)
    assert cycles(graph) == [["cyclic_pkg._a", "cyclic_pkg._b"]]
