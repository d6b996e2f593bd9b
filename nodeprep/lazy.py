"""Package attributes loaded on first use (PEP 562).

Ansible modules start a fresh interpreter for every task, so a package's __init__ should not import
every submodule: `nodeprep.join.cdi` must not pull in the whole join planner, nor
`nodeprep.labels.gpu` the cloud metadata client.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level __getattr__ for `package`: name -> getattr(package.<exports[name]>, name)."""

    def __getattr__(name: str) -> Any:
        try:
            submodule = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        return getattr(importlib.import_module(f"{package}.{submodule}"), name)

    return __getattr__
