"""Triton's version key, remembered across processes under a cheap fingerprint of the files it is computed from.

Why: in every new process Triton's first kernel launch, even of a kernel in its disk cache, calls
``triton.runtime.cache.triton_key()``, which SHA-256-hashes Triton's compiler, backend and language sources and its
400 MB ``libtriton``: about 0.3 s of a second process's calibration. ``$DITGATE_CACHE_DIR/triton-key-v1.json``
keeps the value under a fingerprint of those files' ``stat`` (a few ms), taken over whole folders (a superset of what
``triton_key`` reads); a rewrite or reinstall changes a ctime, so a changed Triton is always a miss.

No name of Triton's is replaced. ``triton_key`` is ``functools.lru_cache()(f)``, and every reader
(``get_cache_key``, the autotuner's imported name, ``torch._inductor.runtime.triton_compat``) calls that one object.
On a hit, ``install`` fills its cache: for one call, under a lock, ``f.__code__`` is the code of a function that
returns the remembered string as a constant, and the original code is back in a ``finally``. Afterwards every name
is Triton's own function, whose cache holds exactly the value Triton would compute (what the memo saved is what
``triton_key`` returned under the same fingerprint), so a detached plan leaves nothing of ditgate in Triton. Where
``triton_key`` is not of that shape (no ``__wrapped__``, a closure, arguments), nothing is seeded. On a miss nothing
is touched: Triton hashes when it first asks, as without the memo (a process that launches no Triton pays nothing),
and ``remember()``, which ``attach``'s plan calls when a denoiser's calibration ends and on detach, saves the value
its cache then holds (no hashing: a cached value). Off under ``TRITON_INTERPRET=1`` (the interpreter never
compiles, so never asks) and with ``DITGATE_TRITON_KEY_MEMO=0``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Iterator
from inspect import CO_VARARGS, CO_VARKEYWORDS
from pathlib import Path
from types import CodeType, FunctionType, ModuleType

import torch

from ..cache_dir import cache_root

logger = logging.getLogger("ditgate.kernels")

MEMO_VERSION = 1
MAX_ENTRIES = 4  # Triton installs remembered (venvs may share a cache root); the oldest goes first
VERIFIED = ("3.6.",)  # versions whose triton_key was read: it hashes no file outside the fingerprint

_lock = threading.Lock()  # this module's process state
_seed_lock = threading.Lock()  # held while triton_key's function runs the constant code
_word: str | None = None  # what this process's install did; None until it ran
_pending: tuple[Path, str] | None = None  # after a miss: (memo file, fingerprint) remember() saves under, once
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


def save_memo(path: Path, fp: str, key: str) -> bool:
    """``fp -> key`` added to the file's entries now (another process may have added one), atomically; False (said)
    where it could not be written."""
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
        return False
    return True


def _constant_code(key: str) -> CodeType:
    """The code of ``def triton_key(): return <key>``: the string a constant of the code (a name would be looked up
    in Triton's module globals, the function's, when it runs there)."""
    namespace: dict[str, Callable[[], str]] = {}
    exec(compile(f"def triton_key():\n    return {key!r}\n", "<ditgate.triton_key_memo>", "exec"), {}, namespace)
    return namespace["triton_key"].__code__


def _seedable(triton_key: object) -> bool:
    """Triton's ``triton_key`` as read: an lru cache around a function of no arguments and no closure."""
    f = getattr(triton_key, "__wrapped__", None)
    return (hasattr(triton_key, "cache_info") and hasattr(triton_key, "cache_clear") and isinstance(f, FunctionType)
            and not f.__code__.co_freevars and f.__closure__ is None and f.__code__.co_argcount == 0
            and not f.__code__.co_kwonlyargcount and not f.__code__.co_flags & (CO_VARARGS | CO_VARKEYWORDS))


def _seed(triton_key: Callable[[], str], key: str) -> None:
    """Fill ``triton_key``'s own lru cache with ``key``: its function runs the constant code for one call, its own
    code back in place after it. Raises (the cache emptied) where the cache does not then hold exactly ``key``."""
    f, code = triton_key.__wrapped__, _constant_code(key)
    if code.co_freevars or code.co_names or f.__code__.co_freevars:
        raise RuntimeError("triton_key's function or the constant code has free names; not seeded")
    with _seed_lock:
        own = f.__code__
        try:
            f.__code__ = code
            try:
                triton_key()
            finally:
                f.__code__ = own
            held = triton_key.cache_info().currsize == 1 and triton_key() == key
        except BaseException:
            triton_key.cache_clear()
            raise
    if not held:
        triton_key.cache_clear()  # Triton computes its own when it asks
        raise RuntimeError("triton_key's cache did not take the remembered value")


def _triton_cache(require_cuda: bool) -> ModuleType | None:
    """``triton.runtime.cache`` where the memo applies (a verified Triton, its lru-cached key of the shape read, no
    interpreter)."""
    if require_cuda and not torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return None
    import triton
    from triton.runtime import cache
    usable = triton.__version__.startswith(VERIFIED) and _seedable(getattr(cache, "triton_key", None))
    return cache if usable and not triton.knobs.runtime.interpret else None


def _install(require_cuda: bool) -> str:
    global _pending
    if os.environ.get("DITGATE_TRITON_KEY_MEMO") == "0":
        return "disabled"
    cache = _triton_cache(require_cuda)
    if cache is None:
        return "unavailable"
    fp = fingerprint(os.path.dirname(os.path.dirname(os.path.abspath(cache.__file__))), cache.__version__)
    path, triton_key = memo_path(), cache.triton_key
    if triton_key.cache_info().currsize:  # computed already in this process: nothing to seed, keep it for next time
        if read_memo(path).get(fp) != triton_key():
            save_memo(path, fp, triton_key())
        return "already"
    key = read_memo(path).get(fp)
    if key is not None and key.startswith(cache.__version__):  # triton_key's value begins with it
        _seed(triton_key, key)
        return "hit"
    _pending = (path, fp)
    return "miss"


def install(*, require_cuda: bool = False) -> str:
    """Fill Triton's ``triton_key`` cache from the memo; once per process (later calls return the first answer):
    "hit" (its cache holds the remembered value), "miss" (nothing touched; ``remember()`` saves Triton's value once
    computed), "already" (Triton had computed it; saved if new), "disabled", "unavailable" (no Triton; no CUDA where
    ``require_cuda``; the interpreter; an unverified Triton or ``triton_key`` of another shape) or "failed" (said
    once: it never raises, as a failure here must not cost ``attach`` its routes)."""
    global _word
    with _lock:
        if _word is None:
            try:
                _word = _install(require_cuda)
            except Exception as exc:
                _warn_once("install", "ditgate: Triton key memo skipped: %s: %s", type(exc).__name__, exc)
                return "failed"
        return _word


def remember() -> bool:
    """After a miss, save the key Triton's cache now holds (reading it hashes nothing); True when saved. Cheap where
    there is nothing to do: without a miss to complete, or while Triton has not computed the key, it looks at no file;
    once the key is found (saved here, or saved by another process meanwhile) it is done for the process. Never
    raises (a failure is said once)."""
    global _pending
    with _lock:
        if _pending is None:
            return False
        try:
            from triton.runtime import cache
            if not cache.triton_key.cache_info().currsize:
                return False
            path, fp = _pending
            key = cache.triton_key()  # the cached value
            _pending = None
            if read_memo(path).get(fp) == key:
                return False
            return save_memo(path, fp, key)
        except Exception as exc:
            _pending = None
            _warn_once("remember", "ditgate: Triton key memo not saved: %s: %s", type(exc).__name__, exc)
            return False


def forget_triton_key() -> None:
    """Empty Triton's own ``triton_key`` cache (for tests: ``uninstall`` cannot undo a seed, and the next call
    computes Triton's value again)."""
    from triton.runtime import cache
    cache.triton_key.cache_clear()


def uninstall() -> None:
    """Forget this process's install, its pending save and its warnings (for tests). Triton holds nothing of ditgate
    to put back; its cache keeps the value it holds (``forget_triton_key`` empties it)."""
    global _word, _pending
    with _lock:
        _warned.clear()
        _word = _pending = None
