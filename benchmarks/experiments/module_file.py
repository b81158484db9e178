"""An earlier commit's module loaded from a file, for an A/B against the tree's in one run (``pin_ab.py``'s
kernel, ``host_costs.py``'s quantization). The file is not kept in the tree; write it with ``git show
REV:ditgate/kernels/NAME.py``, its relative imports made absolute."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def load_module(path: str, name: str) -> ModuleType:
    """The module in ``path``, registered under ``name`` (dataclasses look their module up by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
