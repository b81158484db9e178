"""Triton's version key, remembered across processes under a cheap fingerprint of the files it is computed from.

Why: in every new process Triton's first kernel launch, even of a kernel in its disk cache, calls
``triton.runtime.cache.triton_key()``, which SHA-256-hashes Triton's compiler, backend and language sources and its
400 MB ``libtriton``: about 0.3 s of a second process's calibration. ``$DITGATE_CACHE_DIR/triton-key-v1.json``
keeps the value under a fingerprint of those files' ``stat`` (a few ms), taken over whole folders (a superset of what
``triton_key`` reads); a rewrite or reinstall changes a ctime, so a changed Triton is always a miss.

The names through which Triton reaches the key are replaced: ``triton.runtime.cache.triton_key`` (``get_cache_key``
reads that global at call time; in Triton 3.6 ``triton.compile`` and the JIT's asynchronous compile reach the file
cache only through it), the autotuner's imported ``triton_key`` and, where imported,
``torch._inductor.runtime.triton_compat.triton_key`` (Inductor reads it there at call time; imported later, it takes
the replaced one). On a hit they return the remembered string, the one Triton would compute; on a miss Triton's own
value, computed when Triton first asks (a process that launches no Triton pays nothing) and saved. Off under
``TRITON_INTERPRET=1`` (the interpreter never compiles, so never asks) and with ``DITGATE_TRITON_KEY_MEMO=0``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import torch

from ..cache_dir import cache_root

logger = logging.getLogger("ditgate.kernels")

MEMO_VERSION = 1
MAX_ENTRIES = 4  # Triton installs remembered (venvs may share a cache root); the oldest goes first
VERIFIED = ("3.6.",)  # versions whose triton_key was read: it hashes no file outside the fingerprint
PATCHED = ("triton.runtime.cache", "triton.runtime.autotuner", "torch._inductor.runtime.triton_compat")

_lock = threading.Lock()
_word: str | None = None  # what this process's install did; None until it ran
_originals: dict[str, Callable[[], str]] = {}  # module name -> its triton_key before the patch
_warned: set[str] = set()


def memo_path() -> Path:
    return cache_root() / f"triton-key-v{MEMO_VERSION}.json"


def _files(folder: Path) -> Iterator[Path]:
    """Every file below ``folder``, symlinked folders followed (as ``pkgutil`` does), ``__pycache__`` skipped (the
    module origins ``triton_key`` reads are sources, or sourceless ``.pyc`` beside them, never cached ones)."""
    for top, folders, names in os.walk(folder, followlinks=True):
        folders[:] = [f for f in folders if f != "__pycache__"]
        yield from (Path(top) / name for name in names)


def _row(root: Path, path: Path) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return f"{os.path.relpath(path, root)}\tmissing"
    return f"{os.path.relpath(path, root)}\t{st.st_size}\t{st.st_mtime_ns}\t{st.st_ctime_ns}\t{st.st_ino}"


def fingerprint_rows(root: str | Path, version: str) -> list[str]:
    """What ``triton_key`` reads, by ``stat`` alone: the version, the Triton folder ``root`` (a second install is a
    second entry), a row of each file's path, size, mtime, ctime and inode (``stat`` follows links, as ``open``)."""
    root = Path(os.path.abspath(root))
    ext = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").split(".")[-1]
    walked = sorted(p for name in ("compiler", "backends", "language") for p in _files(root / name))
    named = [root / "runtime" / "cache.py", root / "_C" / f"libtriton.{ext}"]
    return [version, str(root)] + [_row(root, p) for p in named + walked]


def fingerprint(root: str | Path, version: str) -> str:
    return hashlib.sha256("\n".join(fingerprint_rows(root, version)).encode()).hexdigest()


def _warn_once(what: str, message: str, *args: object) -> None:
    if what not in _warned:
        _warned.add(what)
        logger.warning(message, *args)


def read_memo(path: Path) -> dict[str, str]:
    """fingerprint -> key, oldest first; {} (with one warning) when the file is corrupt or not of this format."""
    why = f"not a version-{MEMO_VERSION} memo"
    try:
        payload = json.loads(path.read_text())
        keys = payload.get("keys") if isinstance(payload, dict) and payload.get("version") == MEMO_VERSION else None
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        keys, why = None, f"cannot read: {exc}"
    if isinstance(keys, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
        return keys
    _warn_once(str(path), "ditgate: Triton key memo %s ignored (%s); it is replaced at the next save", path, why)
    return {}


def save_memo(path: Path, fp: str, key: str) -> None:
    """``fp -> key`` added to the file's entries now (another process may have added one), atomically."""
    keys = {**{k: v for k, v in read_memo(path).items() if k != fp}, fp: key}  # fp moves to the newest end
    payload = {"version": MEMO_VERSION, "keys": dict(list(keys.items())[-MAX_ENTRIES:])}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".triton-key-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("ditgate: could not write the Triton key memo %s: %s", path, exc)


def _recording(original: Callable[[], str], path: Path, fp: str) -> Callable[[], str]:
    """A miss's stand-in: Triton's own key, saved once computed. Locked, so threads that launch their first kernels
    together wait for one hash instead of each hashing (Triton's ``lru_cache`` lets them)."""
    lock, saved = threading.Lock(), []

    @functools.lru_cache(maxsize=None)
    def triton_key() -> str:
        with lock:
            key = original()
            if not saved:  # the first thread here saves; one that waited finds the key computed and saved
                saved.append(save_memo(path, fp, key))
            return key

    return triton_key


def _patch(stand_in: Callable[[], str]) -> None:
    for name in PATCHED:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "triton_key"):
            _originals[name] = module.triton_key
            module.triton_key = stand_in


def _triton_cache(require_cuda: bool) -> ModuleType | None:
    """``triton.runtime.cache`` where the memo applies (a verified Triton, its lru-cached key, no interpreter)."""
    if require_cuda and not torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return None
    import triton
    from triton.runtime import autotuner, cache  # noqa: F401  (the autotuner holds one of the names replaced)
    usable = triton.__version__.startswith(VERIFIED) and hasattr(getattr(cache, "triton_key", None), "cache_info")
    return cache if usable and not triton.knobs.runtime.interpret else None


def _install(require_cuda: bool) -> str:
    if os.environ.get("DITGATE_TRITON_KEY_MEMO") == "0":
        return "disabled"
    cache = _triton_cache(require_cuda)
    if cache is None:
        return "unavailable"
    fp = fingerprint(os.path.dirname(os.path.dirname(os.path.abspath(cache.__file__))), cache.__version__)
    path, original = memo_path(), cache.triton_key
    if original.cache_info().currsize:  # computed already in this process: nothing to save, keep it for next time
        if read_memo(path).get(fp) != original():
            save_memo(path, fp, original())
        return "already"
    key = read_memo(path).get(fp)
    if key is not None and key.startswith(cache.__version__):  # triton_key's value begins with it
        _patch(functools.lru_cache(maxsize=None)(lambda: key))  # of triton_key's shape: an lru_cache
        return "hit"
    _patch(_recording(original, path, fp))
    return "miss"


def install(*, require_cuda: bool = False) -> str:
    """Serve ``triton_key`` from the memo, or fill it when Triton computes it; once per process (later calls return
    the first answer): "hit", "miss", "already" (Triton had computed it), "disabled", "unavailable" (no Triton; no
    CUDA where ``require_cuda``; the interpreter; an unverified Triton) or "failed" (said once: it never raises, as a
    failure here must not cost ``attach`` its routes)."""
    global _word
    with _lock:
        if _word is None:
            try:
                _word = _install(require_cuda)
            except Exception as exc:
                _warn_once("install", "ditgate: Triton key memo skipped: %s: %s", type(exc).__name__, exc)
                return "failed"
        return _word


def uninstall() -> None:
    """Put Triton's own ``triton_key`` back and forget this process's install and warnings (for tests)."""
    global _word
    with _lock:
        for name in _originals.keys() & sys.modules.keys():  # a module removed since has nothing to restore
            sys.modules[name].triton_key = _originals[name]
        _originals.clear()
        _warned.clear()
        _word = None
