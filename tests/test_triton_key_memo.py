"""Triton's version key remembered across processes (``kernels.triton_key_memo``).

Triton's own ``triton_key()`` hashes 400 MB, so it runs once here (the module fixture's miss); every other test
stands a filled ``lru_cache`` in for it, which ``install`` cannot tell from Triton's. Every test starts and ends
with Triton's names as Triton left them (``uninstall``), and runs without the interpreter that conftest sets (under
it ``install`` does nothing)."""

import functools
import json
import logging
import os
import pkgutil
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import types

import pytest

triton = pytest.importorskip("triton")
from triton.runtime import autotuner, cache  # noqa: E402

import ditgate  # noqa: E402
from ditgate.kernels import triton_key_memo as memo  # noqa: E402

from .helpers import Tiny  # noqa: E402

TRITON_PATH = os.path.dirname(os.path.dirname(os.path.abspath(cache.__file__)))
ORIGINAL = cache.triton_key
COMPAT = "torch._inductor.runtime.triton_compat"


def _filled(value: str):
    """A stand-in for Triton's ``triton_key`` whose lru cache already holds ``value`` (as after a first call)."""
    fake = functools.lru_cache()(lambda: value)
    fake()
    return fake


def _empty(value: str, calls: list | None = None, delay_s: float = 0.0):
    """A stand-in for Triton's ``triton_key`` not called yet; each computation is appended to ``calls``."""

    @functools.lru_cache()
    def fake() -> str:
        time.sleep(delay_s)
        if calls is not None:
            calls.append(threading.current_thread().name)
        return value

    return fake


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("DITGATE_TRITON_KEY_MEMO", raising=False)
    memo.uninstall()
    yield
    memo.uninstall()
    monkeypatch.undo()  # the test's own stand-ins go too
    assert cache.triton_key is ORIGINAL and autotuner.triton_key is ORIGINAL


@pytest.fixture(scope="module")
def missed(tmp_path_factory):
    """One real miss: Triton's ``triton_key`` (its lru cache emptied first) computed once, when asked for through
    ``get_cache_key`` as Triton asks, and saved. Returns the install's word, whether the file existed before the key
    was asked for, the key ``get_cache_key`` saw, and the file."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DITGATE_CACHE_DIR", str(tmp_path_factory.mktemp("memo")))
        mp.delenv("TRITON_INTERPRET", raising=False)
        mp.delenv("DITGATE_TRITON_KEY_MEMO", raising=False)
        memo.uninstall()
        ORIGINAL.cache_clear()
        word = memo.install()
        before = memo.memo_path().exists()
        part = types.SimpleNamespace(hash=lambda: "h")
        seen = cache.get_cache_key(part, part, part, {}).removesuffix("-h-h-h-[]")
        memo.uninstall()
        return word, before, seen, memo.memo_path()


def _real_fingerprint() -> str:
    return memo.fingerprint(TRITON_PATH, triton.__version__)


def _copy_memo(path) -> None:
    memo.memo_path().parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, memo.memo_path())


def test_a_miss_stores_triton_s_own_key_when_triton_first_asks_for_it(missed):
    word, before, seen, path = missed
    stored = memo.read_memo(path)
    assert word == "miss" and not before
    assert list(stored) == [_real_fingerprint()]
    assert stored[_real_fingerprint()] == seen == ORIGINAL()  # the original's lru cache holds what it computed
    assert seen.startswith(triton.__version__) and len(seen) > 1000


def test_a_miss_hashes_nothing_until_triton_asks(monkeypatch):
    fake = _empty(f"{triton.__version__}-fake")
    monkeypatch.setattr(cache, "triton_key", fake)
    assert memo.install() == "miss"
    assert fake.cache_info().currsize == 0 and not memo.memo_path().exists()
    assert autotuner.triton_key() == f"{triton.__version__}-fake"  # any of the replaced names records it
    assert memo.read_memo(memo.memo_path()) == {_real_fingerprint(): f"{triton.__version__}-fake"}


def test_a_hit_serves_the_key_through_get_cache_key_without_hashing(missed, monkeypatch):
    _copy_memo(missed[-1])
    key = memo.read_memo(memo.memo_path())[_real_fingerprint()]
    compat = types.ModuleType(COMPAT)
    compat.triton_key = ORIGINAL
    monkeypatch.setitem(sys.modules, COMPAT, compat)
    ORIGINAL.cache_clear()  # a call of Triton's own would hash again now
    assert memo.install() == "hit"

    class NoHashing:
        def __getattr__(self, name):
            raise AssertionError(f"triton_key hashed (hashlib.{name})")

    monkeypatch.setattr(cache, "hashlib", NoHashing())
    part = types.SimpleNamespace(hash=lambda: "h")
    assert cache.get_cache_key(part, part, part, {}).startswith(f"{key}-h-h-h-")
    assert triton.compiler.compiler.get_cache_key is cache.get_cache_key  # what triton.compile calls
    assert autotuner.triton_key() == key and compat.triton_key() == key
    assert ORIGINAL.cache_info().currsize == 0


SECOND_PROCESS = """
import json, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime import cache
from ditgate.kernels import triton_key_memo as memo

@triton.jit
def copy(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, tl.load(x + i, mask=i < n), mask=i < n)

hits = []
triton.knobs.compilation.listener = lambda *, cache_hit, **_: hits.append(cache_hit)
def compile_copy():
    src = triton.compiler.ASTSource(copy, {"x": "*fp32", "y": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                    constexprs={"BLOCK": 64})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).hash
try:
    first = compile_copy()  # Triton's own key
except Exception as exc:
    print(json.dumps({"skip": f"{type(exc).__name__}: {exc}"[:300]}))
    raise SystemExit
cache.triton_key.cache_clear()
word = memo.install()
cache.hashlib = None  # triton_key's hashing would raise now
print(json.dumps({"word": word, "same": compile_copy() == first, "hits": hits}))
"""


def test_a_kernel_cached_under_triton_s_own_key_loads_under_the_remembered_one(missed, tmp_path):
    """In a process without the interpreter (one that ran under it cannot compile), a kernel compiled for sm_90 (no
    GPU needed: Triton's front end, LLVM and its bundled ptxas) with Triton's own key, then again with the memo's: the
    second compile is a disk-cache hit of the same kernel, and nothing hashed."""
    _copy_memo(missed[-1])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    script = tmp_path / "second_process.py"  # Triton reads a kernel's source from its file
    script.write_text(SECOND_PROCESS)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(f"cannot compile for sm_90 here: {result['skip']}")
    assert result == {"word": "hit", "same": True, "hits": [False, True]}


def test_install_runs_once_per_process_and_uninstall_restores(missed, monkeypatch):
    _copy_memo(missed[-1])
    compat = types.ModuleType(COMPAT)
    compat.triton_key = ORIGINAL
    monkeypatch.setitem(sys.modules, COMPAT, compat)
    ORIGINAL.cache_clear()
    assert memo.install() == "hit"
    memo.memo_path().unlink()
    assert memo.install() == "hit"  # the first answer, the file not read again
    assert cache.triton_key is not ORIGINAL
    memo.uninstall()
    assert cache.triton_key is ORIGINAL and autotuner.triton_key is ORIGINAL and compat.triton_key is ORIGINAL


def test_the_fingerprint_covers_every_file_triton_key_reads():
    """The files ``triton_key`` opens, found as it finds them, each have a row (never a subset)."""
    rows = {row.split("\t")[0] for row in memo.fingerprint_rows(TRITON_PATH, triton.__version__)[2:]}
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    read = {os.path.join("runtime", "cache.py"), os.path.join("_C", f"libtriton.{ext}")}
    for folder in ("compiler", "backends", "language"):
        for lib in pkgutil.walk_packages([os.path.join(TRITON_PATH, folder)], prefix=f"triton.{folder}."):
            read.add(os.path.relpath(lib.module_finder.find_spec(lib.name).origin, TRITON_PATH))
    assert len(read) > 20
    assert read <= rows
    assert not any(row.split("\t")[-1] == "missing" for row in memo.fingerprint_rows(TRITON_PATH, "v")[2:])


def _fake_triton(root):
    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    files = {"runtime/cache.py": "key", f"_C/libtriton.{ext}": "lib", "compiler/a.py": "a",
             "backends/nvidia/b.py": "b", "language/c.py": "c", "language/__pycache__/c.cpython.pyc": "pyc"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("change", ["grow", "mtime", "add", "library", "cache_py", "version"])
def test_any_change_to_what_triton_key_reads_changes_the_fingerprint(tmp_path, change):
    root = _fake_triton(tmp_path / "triton")
    before = memo.fingerprint(root, "3.6.0")
    assert memo.fingerprint(root, "3.6.0") == before  # stable while nothing changes
    version = "3.6.0"
    if change == "grow":
        (root / "compiler/a.py").write_text("a, longer")
    elif change == "mtime":
        st = os.stat(root / "language/c.py")
        os.utime(root / "language/c.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    elif change == "add":
        (root / "backends/nvidia/new.py").write_text("")
    elif change == "library":
        next((root / "_C").iterdir()).write_text("lib2")
    elif change == "cache_py":
        (root / "runtime/cache.py").write_text("key2")
    else:
        version = "3.6.1"
    assert memo.fingerprint(root, version) != before


def test_cached_bytecode_and_another_root_are_told_apart_correctly(tmp_path):
    root = _fake_triton(tmp_path / "triton")
    before = memo.fingerprint(root, "3.6.0")
    (root / "language/__pycache__/c.cpython.pyc").write_text("recompiled")
    assert memo.fingerprint(root, "3.6.0") == before  # a rewritten .pyc is no change to what triton_key reads
    shutil.copytree(root, tmp_path / "other")
    assert memo.fingerprint(tmp_path / "other", "3.6.0") != before


@pytest.mark.parametrize("text", ["{not json", '{"version": 2, "keys": {}}', "[1, 2]",
                                  '{"version": 1, "keys": {"fp": 3}}'])
def test_a_corrupt_or_foreign_memo_warns_once_misses_and_is_replaced(monkeypatch, caplog, text):
    memo.memo_path().parent.mkdir(parents=True, exist_ok=True)
    memo.memo_path().write_text(text)
    monkeypatch.setattr(cache, "triton_key", _empty(f"{triton.__version__}-fake"))
    with caplog.at_level(logging.WARNING, logger="ditgate.kernels"):
        assert memo.install() == "miss"
        cache.triton_key()
    assert len([r for r in caplog.records if r.name == "ditgate.kernels"]) == 1
    payload = json.loads(memo.memo_path().read_text())
    assert payload == {"version": 1, "keys": {_real_fingerprint(): f"{triton.__version__}-fake"}}


def test_the_environment_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("DITGATE_TRITON_KEY_MEMO", "0")
    fake = _empty(f"{triton.__version__}-fake")
    monkeypatch.setattr(cache, "triton_key", fake)
    assert memo.install() == "disabled"
    assert cache.triton_key is fake and fake.cache_info().currsize == 0
    assert not memo.memo_path().exists()


def test_a_key_already_computed_is_kept_for_next_time_and_nothing_is_replaced(monkeypatch):
    fake = _filled(f"{triton.__version__}-already")
    monkeypatch.setattr(cache, "triton_key", fake)
    assert memo.install() == "already"
    assert cache.triton_key is fake
    assert memo.read_memo(memo.memo_path()) == {_real_fingerprint(): f"{triton.__version__}-already"}
    memo.uninstall()
    monkeypatch.setattr(cache, "triton_key", _empty("never called"))
    assert memo.install() == "hit" and cache.triton_key() == f"{triton.__version__}-already"


@pytest.mark.parametrize("why", ["interpreter", "version", "cuda"])
def test_where_it_does_not_apply_nothing_is_read_written_or_replaced(monkeypatch, why):
    if why == "cuda" and memo.torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    fake = _empty(f"{triton.__version__}-fake")
    monkeypatch.setattr(cache, "triton_key", fake)
    if why == "interpreter":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    elif why == "version":
        monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert memo.install(require_cuda=why == "cuda") == "unavailable"
    assert cache.triton_key is fake and fake.cache_info().currsize == 0
    assert not memo.memo_path().exists()


def test_two_threads_that_launch_together_compute_the_key_once(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(cache, "triton_key", _empty(f"{triton.__version__}-slow", calls, delay_s=0.2))
    saved: list[str] = []
    save = memo.save_memo
    monkeypatch.setattr(memo, "save_memo", lambda *args: saved.append(args[-1]) or save(*args))
    words: list[str] = []
    threads = [threading.Thread(target=lambda: words.append(memo.install()) or cache.triton_key()) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert words == ["miss", "miss"] and len(calls) == 1 and saved == [f"{triton.__version__}-slow"]


def test_the_file_keeps_the_newest_entries():
    path = memo.memo_path()
    for i in range(memo.MAX_ENTRIES + 2):
        memo.save_memo(path, f"fp{i}", f"key{i}")
    memo.save_memo(path, "fp2", "key2")  # seen again: now the newest
    assert list(memo.read_memo(path)) == ["fp3", "fp4", "fp5", "fp2"][-memo.MAX_ENTRIES:]


def test_a_failure_inside_never_reaches_attach(monkeypatch, caplog):
    monkeypatch.setattr(memo, "fingerprint", lambda *a: 1 / 0)
    with caplog.at_level(logging.WARNING, logger="ditgate.kernels"):
        assert memo.install() == "failed"
        assert memo.install() == "failed"
    assert len([r for r in caplog.records if "ZeroDivisionError" in r.getMessage()]) == 1
    assert cache.triton_key is ORIGINAL


def test_attach_installs_it_before_any_form_is_made(monkeypatch):
    seen: list[str] = []
    created = ditgate.api.plan.create_forms
    monkeypatch.setattr(memo, "install", lambda **kw: seen.append(f"install {kw}") or "unavailable")
    monkeypatch.setattr(ditgate.api.plan, "create_forms", lambda: seen.append("forms") or created())
    plan = ditgate.attach(Tiny("tiny-wan").model, measure=False)
    plan.detach()
    assert seen == ["install {'require_cuda': True}", "forms"]
