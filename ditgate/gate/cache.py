"""The timing cache: the book's timings kept on disk, so that a second process measures only accuracy.

A server restarts with the same GPU, driver and packages many times; each start would otherwise time every form at
every shape again. Entries are grouped under a key of the environment they were measured in (``environment()``:
GPU, capability, CUDA, torch, diffusers, Triton and every form package's version, ditgate's own), so an upgrade of
any of them is a miss, never a stale hit. Accuracy is never cached: each site still checks its forms on its own
input.

The file is JSON at ``$DITGATE_CACHE_DIR/timings-v1.json`` (default ``$XDG_CACHE_HOME/ditgate`` or
``~/.cache/ditgate``). A file that cannot be read (corrupt, another format version) is ignored with one warning and
replaced at the next save; writes go to a temporary file renamed into place, merged with what another process wrote
meanwhile. ``attach(..., timing_cache=False)`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from ..cache_dir import cache_root

logger = logging.getLogger("ditgate.gate")

CACHE_VERSION = 1


def default_cache_path() -> Path:
    return cache_root() / f"timings-v{CACHE_VERSION}.json"


def environment_key(environment: dict) -> str:
    """A short stable key of everything a timing depends on (the Python version does not time kernels)."""
    body = {k: v for k, v in environment.items() if k != "python"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:24]


class TimingCache:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self._warned = False

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("ditgate: timing cache %s ignored (%s); it is replaced at the next save", self.path, why)

    def _read(self) -> dict:
        """The whole file's environments, or {} (with a warning) when it is missing, corrupt or of another version."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self._warn(f"cannot read: {exc}")
            return {}
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as exc:
            self._warn(f"not JSON: {exc}")
            return {}
        if not isinstance(payload, dict) or payload.get("version") != CACHE_VERSION:
            version = payload.get("version") if isinstance(payload, dict) else None
            self._warn(f"format version {version!r}, expected {CACHE_VERSION}")
            return {}
        envs = payload.get("environments")
        if not isinstance(envs, dict):
            self._warn("no 'environments' table")
            return {}
        return envs

    def load(self, environment: dict) -> dict[str, dict]:
        """This environment's entries (timing key text -> entry), {} on a miss."""
        found = self._read().get(environment_key(environment), {})
        entries = found.get("entries") if isinstance(found, dict) else None
        return entries if isinstance(entries, dict) else {}

    def save(self, environment: dict, entries: dict[str, dict]) -> None:
        envs = self._read()
        key = environment_key(environment)
        slot = envs.get(key) if isinstance(envs.get(key), dict) else {}
        merged = dict(slot.get("entries") or {})
        merged.update(entries)
        envs[key] = {"environment": environment, "entries": merged}
        payload = {"version": CACHE_VERSION, "environments": envs}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".timings-", suffix=".json", dir=self.path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump(payload, f, indent=1, sort_keys=True, default=str)
            os.replace(tmp, self.path)
        except OSError as exc:
            logger.warning("ditgate: could not write the timing cache %s: %s", self.path, exc)

    def clear(self) -> bool:
        """Delete the cache file; True if there was one."""
        try:
            self.path.unlink()
            return True
        except FileNotFoundError:
            return False
