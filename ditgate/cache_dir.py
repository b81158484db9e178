"""Where ditgate keeps what it learns across processes: ``$DITGATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ditgate``,
else ``~/.cache/ditgate``. The timing cache lives here, and so do the kernels flash-attn-4 compiled."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("DITGATE_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ditgate"
