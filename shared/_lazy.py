"""Lazy public names of a package (PEP 562): a name's module is imported when the name is first used.

A package's ``__init__`` binds ``__getattr__ = lazy_exports(__name__, {...})`` so that
importing the package (or one light module of it, such as the CLI) does not load the
heavy modules behind its public names. Type checkers see the names through
``if TYPE_CHECKING:`` imports in that ``__init__``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(module_name: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """Return a module ``__getattr__`` for package ``module_name`` that serves the names of ``where``.

    ``where`` maps each public name to the module that defines it, relative to
    the package (``"._worker"``). The module is imported on the first lookup of
    one of its names (Python caches it in ``sys.modules`` from then on).

    The returned function returns the name's value. It raises AttributeError,
    naming ``module_name``, for a name not in ``where`` (what ``hasattr`` and
    ``from package import name`` expect), and lets an ImportError of the
    defining module propagate.
    """
    table = dict(where)  # a copy: later changes to the caller's mapping do not change the package

    def __getattr__(name: str) -> Any:
        """Return the public name ``name``, importing its module on first use.

        Raises:
            AttributeError: no such public name.
        """
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, module_name), name)

    return __getattr__


__all__ = ["lazy_exports"]
