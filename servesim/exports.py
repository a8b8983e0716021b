"""Lazy public names of a package: ``__all__`` and a module ``__getattr__`` (PEP 562).

A package's public names live in submodules, and some of those are heavy (altair for reports,
pandas for sweeps): importing them when the package is imported would charge every process that
touches one submodule (``servesim run`` prints through report/console.py) for all of them. So a
package declares ``__all__, __getattr__ = exports(__name__, {...})`` and each name is imported on
first use. docs/architecture.md says what is public; tests/test_public_api.py holds the docs and
notebooks to it.
"""

from __future__ import annotations

import importlib
from typing import Callable


def exports(package: str, names: dict[str, str]) -> tuple[list[str], Callable[[str], object]]:
    """``names``: public name -> the module defining it (a submodule given as its own name is the
    submodule itself: ``{"charts": "servesim.report.charts"}``)."""

    def __getattr__(name: str):
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(where)
        return module if where == f"{package}.{name}" else getattr(module, name)

    return sorted(names), __getattr__
