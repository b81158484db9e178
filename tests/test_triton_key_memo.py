"""Triton's version key remembered across processes (``kernels.triton_key_memo``).

Triton's own ``triton_key()`` hashes 400 MB, so it runs once here (the module fixture's miss); a hit seeds Triton's
own function cheaply, and the other tests stand in an lru-cached function of the same shape, which ``install`` cannot
tell from Triton's. Every test starts with Triton's cache emptied and this process's memo state forgotten, and ends
with Triton's names and code as Triton left them; all run without the interpreter that conftest sets (under it
``install`` does nothing)."""

import functools
import json
import logging
import os
import pkgutil
import shutil
import sys
import sysconfig
import types

import pytest

triton = pytest.importorskip("triton")
from triton.runtime import autotuner, cache  # noqa: E402

import ditgate  # noqa: E402
from ditgate.kernels import triton_key_memo as memo  # noqa: E402

from .helpers import Tiny, compiled_child  # noqa: E402

TRITON_PATH = os.path.dirname(os.path.dirname(os.path.abspath(cache.__file__)))
ORIGINAL = cache.triton_key
CODE = ORIGINAL.__wrapped__.__code__
COMPAT = "torch._inductor.runtime.triton_compat"
FAKE = f"{triton.__version__}-fake"


def _stand_in(value: str, calls: list | None = None):
    """An lru-cached function of no closure, as Triton's ``triton_key``, not called yet; each computation of its
    own is appended to ``calls``. Its names are its globals (a closure would make it one ``install`` refuses)."""
    namespace = {"VALUE": value, "CALLS": calls if calls is not None else []}
    exec("def triton_key():\n    CALLS.append(1)\n    return VALUE\n", namespace)
    return functools.lru_cache()(namespace["triton_key"])


class NoHashing:
    def __getattr__(self, name):
        raise AssertionError(f"triton_key hashed (hashlib.{name})")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("DITGATE_TRITON_KEY_MEMO", raising=False)
    memo.uninstall()
    memo.forget_triton_key()
    yield
    memo.uninstall()
    monkeypatch.undo()  # the test's own stand-ins go too
    assert cache.triton_key is ORIGINAL and autotuner.triton_key is ORIGINAL
    assert ORIGINAL.__wrapped__.__code__ is CODE
    memo.forget_triton_key()  # a seeded value of a test's own is not left for another test


@pytest.fixture(scope="module")
def missed(tmp_path_factory):
    """One real miss: Triton's ``triton_key`` (its lru cache emptied first) computed once, when asked for through
    ``get_cache_key`` as Triton asks, then saved by ``remember()``. Returns the install's word, whether Triton was
    left untouched and the file absent until then, the key ``get_cache_key`` saw, what ``remember()`` said, and the
    file."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DITGATE_CACHE_DIR", str(tmp_path_factory.mktemp("memo")))
        mp.delenv("TRITON_INTERPRET", raising=False)
        mp.delenv("DITGATE_TRITON_KEY_MEMO", raising=False)
        memo.uninstall()
        ORIGINAL.cache_clear()
        word = memo.install()
        untouched = (cache.triton_key is ORIGINAL and autotuner.triton_key is ORIGINAL
                     and ORIGINAL.__wrapped__.__code__ is CODE and ORIGINAL.cache_info().currsize == 0
                     and not memo.memo_path().exists())
        part = types.SimpleNamespace(hash=lambda: "h")
        seen = cache.get_cache_key(part, part, part, {}).removesuffix("-h-h-h-[]")
        saved = memo.remember()
        memo.uninstall()
        return word, untouched, seen, saved, memo.memo_path()


def _real_fingerprint() -> str:
    return memo.fingerprint(TRITON_PATH, triton.__version__)


def _copy_memo(path) -> None:
    memo.memo_path().parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, memo.memo_path())


def _counting(monkeypatch, name: str) -> list:
    """Each call of ``memo.<name>`` (still run) appended as its arguments."""
    calls: list = []
    inner = getattr(memo, name)
    monkeypatch.setattr(memo, name, lambda *args: calls.append(args) or inner(*args))
    return calls


def test_a_miss_touches_nothing_and_remember_saves_triton_s_own_key(missed):
    word, untouched, seen, saved, path = missed
    assert word == "miss" and untouched
    assert saved is True
    assert memo.read_memo(path) == {_real_fingerprint(): seen}
    assert seen.startswith(triton.__version__) and len(seen) > 1000


def test_remember_saves_the_key_once_triton_computed_it_without_computing_it(monkeypatch):
    computed: list = []
    fake = _stand_in(FAKE, computed)
    monkeypatch.setattr(cache, "triton_key", fake)
    fp = _real_fingerprint()
    fingerprints, saves = _counting(monkeypatch, "fingerprint"), _counting(monkeypatch, "save_memo")
    assert memo.install() == "miss"
    assert cache.triton_key is fake and fake.cache_info().currsize == 0
    assert memo.remember() is False  # Triton has not asked for the key: nothing to save, nothing computed
    assert not memo.memo_path().exists() and computed == []
    assert fake() == FAKE  # Triton's first launch computes it
    assert memo.remember() is True
    assert memo.read_memo(memo.memo_path()) == {fp: FAKE}
    reads = _counting(monkeypatch, "read_memo")
    assert memo.remember() is False and memo.remember() is False and reads == []  # done for the process
    assert computed == [1] and len(saves) == 1 and len(fingerprints) == 1  # the install's fingerprint, kept


def test_remember_does_not_write_a_key_the_file_already_holds(monkeypatch):
    fake = _stand_in(FAKE)
    monkeypatch.setattr(cache, "triton_key", fake)
    assert memo.install() == "miss"
    memo.save_memo(memo.memo_path(), _real_fingerprint(), FAKE)  # another process saved it meanwhile
    saves = _counting(monkeypatch, "save_memo")
    fake()
    assert memo.remember() is False and saves == []


def test_remember_does_nothing_without_a_miss_of_this_process(monkeypatch):
    fake = _stand_in(FAKE)
    monkeypatch.setattr(cache, "triton_key", fake)
    fake()
    assert memo.remember() is False  # install never ran
    monkeypatch.setenv("DITGATE_TRITON_KEY_MEMO", "0")
    assert memo.install() == "disabled" and memo.remember() is False
    assert not memo.memo_path().exists()


def test_a_hit_fills_triton_s_own_cache_and_replaces_nothing(missed, monkeypatch):
    _copy_memo(missed[-1])
    key = memo.read_memo(memo.memo_path())[_real_fingerprint()]
    compat = types.ModuleType(COMPAT)
    compat.triton_key = ORIGINAL
    monkeypatch.setitem(sys.modules, COMPAT, compat)
    assert ORIGINAL.cache_info().currsize == 0  # a call of Triton's own would hash now
    assert memo.install() == "hit"
    assert cache.triton_key is ORIGINAL and autotuner.triton_key is ORIGINAL and compat.triton_key is ORIGINAL
    assert ORIGINAL.__wrapped__.__code__ is CODE
    assert ORIGINAL.cache_info().currsize == 1

    monkeypatch.setattr(cache, "hashlib", NoHashing())
    part = types.SimpleNamespace(hash=lambda: "h")
    assert cache.get_cache_key(part, part, part, {}).startswith(f"{key}-h-h-h-")
    assert triton.compiler.compiler.get_cache_key is cache.get_cache_key  # what triton.compile calls
    assert autotuner.triton_key() == key and compat.triton_key() == key
    assert ORIGINAL.cache_info().misses == 1  # the seeding call only: never computed after it
    memo.memo_path().unlink()
    assert memo.remember() is False and not memo.memo_path().exists()  # a hit has nothing to save


def test_a_hit_never_runs_the_function_s_own_code(monkeypatch):
    computed: list = []
    fake = _stand_in(FAKE, computed)
    own = fake.__wrapped__.__code__
    monkeypatch.setattr(cache, "triton_key", fake)
    remembered = f"{triton.__version__}-remembered-{'0' * 64}"
    memo.save_memo(memo.memo_path(), _real_fingerprint(), remembered)
    assert memo.install() == "hit"
    assert fake() == remembered and computed == []  # a constant of the code, not VALUE of the function's globals
    assert fake.__wrapped__.__code__ is own and fake.cache_info().currsize == 1
    assert memo._constant_code(remembered).co_names == ()


@pytest.mark.parametrize("wrong", ["raises", "another value"])
def test_a_seed_that_goes_wrong_restores_the_code_and_leaves_the_cache_empty(monkeypatch, caplog, wrong):
    computed: list = []
    fake = _stand_in(FAKE, computed)
    own = fake.__wrapped__.__code__
    monkeypatch.setattr(cache, "triton_key", fake)
    memo.save_memo(memo.memo_path(), _real_fingerprint(), FAKE)
    body = "1 / 0" if wrong == "raises" else "'3.6.0-other'"
    namespace: dict = {}
    exec(f"def triton_key():\n    return {body}\n", namespace)
    monkeypatch.setattr(memo, "_constant_code", lambda key: namespace["triton_key"].__code__)
    with caplog.at_level(logging.WARNING, logger="ditgate.kernels"):
        assert memo.install() == "failed"
    assert len([r for r in caplog.records if r.name == "ditgate.kernels"]) == 1
    assert fake.__wrapped__.__code__ is own and fake.cache_info().currsize == 0
    assert fake() == FAKE and computed == [1]  # Triton computes its own when it asks


@pytest.mark.parametrize("shape", ["closure", "no lru cache", "arguments"])
def test_a_triton_key_of_another_shape_is_not_seeded(monkeypatch, shape):
    value = FAKE
    if shape == "closure":
        fake = functools.lru_cache()(lambda: value)
    elif shape == "no lru cache":
        fake = _stand_in(FAKE).__wrapped__
    else:
        fake = functools.lru_cache()(lambda x=1: FAKE)
    monkeypatch.setattr(cache, "triton_key", fake)
    memo.save_memo(memo.memo_path(), _real_fingerprint(), f"{triton.__version__}-remembered")
    assert memo.install() == "unavailable"
    assert fake() == FAKE
    assert memo.read_memo(memo.memo_path()) == {_real_fingerprint(): f"{triton.__version__}-remembered"}


SECOND_PROCESS = """
import json, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime import autotuner, cache
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
original, code = cache.triton_key, cache.triton_key.__wrapped__.__code__
cache.triton_key.cache_clear()
word = memo.install()
cache.hashlib = None  # triton_key's hashing would raise now
same = compile_copy() == first
own = cache.triton_key is original and autotuner.triton_key is original and original.__wrapped__.__code__ is code
print(json.dumps({"word": word, "same": same, "hits": hits, "own": own}))
"""


def test_a_kernel_cached_under_triton_s_own_key_loads_under_the_remembered_one(missed, tmp_path):
    """In a process without the interpreter (one that ran under it cannot compile), a kernel compiled for sm_90 (no
    GPU needed: Triton's front end, LLVM and its bundled ptxas) with Triton's own key, then again after the memo's
    hit: the second compile is a disk-cache hit of the same kernel, nothing hashed, and every name of Triton's is
    its own function after it."""
    _copy_memo(missed[-1])
    result = compiled_child(tmp_path, SECOND_PROCESS, "second_process.py", timeout=120)
    if "skip" in result:
        pytest.skip(f"cannot compile for sm_90 here: {result['skip']}")
    assert result == {"word": "hit", "same": True, "hits": [False, True], "own": True}


def test_install_runs_once_per_process_and_uninstall_forgets_it(missed):
    _copy_memo(missed[-1])
    assert memo.install() == "hit"
    memo.memo_path().unlink()
    assert memo.install() == "hit"  # the first answer, the file not read again
    memo.uninstall()
    memo.forget_triton_key()
    assert ORIGINAL.cache_info().currsize == 0
    assert memo.install() == "miss"  # asked again: the file is gone
    assert cache.triton_key is ORIGINAL and ORIGINAL.cache_info().currsize == 0


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
    fake = _stand_in(FAKE)
    monkeypatch.setattr(cache, "triton_key", fake)
    with caplog.at_level(logging.WARNING, logger="ditgate.kernels"):
        assert memo.install() == "miss"
        fake()
        assert memo.remember() is True
    assert len([r for r in caplog.records if r.name == "ditgate.kernels"]) == 1
    payload = json.loads(memo.memo_path().read_text())
    assert payload == {"version": 1, "keys": {_real_fingerprint(): FAKE}}


def test_the_environment_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("DITGATE_TRITON_KEY_MEMO", "0")
    memo.save_memo(memo.memo_path(), _real_fingerprint(), f"{triton.__version__}-remembered")
    fake = _stand_in(FAKE)
    monkeypatch.setattr(cache, "triton_key", fake)
    assert memo.install() == "disabled"
    assert fake.cache_info().currsize == 0 and fake() == FAKE


def test_a_key_already_computed_is_kept_for_next_time_and_nothing_is_seeded(monkeypatch):
    computed: list = []
    fake = _stand_in(f"{triton.__version__}-already", computed)
    fake()
    monkeypatch.setattr(cache, "triton_key", fake)
    assert memo.install() == "already"
    assert computed == [1] and fake.cache_info().misses == 1
    assert memo.read_memo(memo.memo_path()) == {_real_fingerprint(): f"{triton.__version__}-already"}
    memo.uninstall()
    fresh = _stand_in("never computed", computed)
    monkeypatch.setattr(cache, "triton_key", fresh)
    assert memo.install() == "hit" and fresh() == f"{triton.__version__}-already" and computed == [1]


@pytest.mark.parametrize("why", ["interpreter", "version", "cuda"])
def test_where_it_does_not_apply_nothing_is_read_written_or_seeded(monkeypatch, why):
    if why == "cuda" and memo.torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    fake = _stand_in(FAKE)
    monkeypatch.setattr(cache, "triton_key", fake)
    if why == "interpreter":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    elif why == "version":
        monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert memo.install(require_cuda=why == "cuda") == "unavailable"
    assert fake.cache_info().currsize == 0
    fake()
    assert memo.remember() is False
    assert not memo.memo_path().exists()


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
    assert ORIGINAL.cache_info().currsize == 0


def test_a_failure_to_remember_never_reaches_the_plan(monkeypatch, caplog):
    fake = _stand_in(FAKE)
    monkeypatch.setattr(cache, "triton_key", fake)
    assert memo.install() == "miss"
    monkeypatch.setattr(memo, "read_memo", lambda path: 1 / 0)
    fake()
    with caplog.at_level(logging.WARNING, logger="ditgate.kernels"):
        assert memo.remember() is False
        assert memo.remember() is False
    assert len([r for r in caplog.records if "ZeroDivisionError" in r.getMessage()]) == 1


def test_attach_installs_it_before_any_form_is_made(monkeypatch):
    seen: list[str] = []
    created = ditgate.api.plan.create_forms
    monkeypatch.setattr(memo, "install", lambda **kw: seen.append(f"install {kw}") or "unavailable")
    monkeypatch.setattr(ditgate.api.plan, "create_forms", lambda: seen.append("forms") or created())
    plan = ditgate.attach(Tiny("tiny-wan").model, measure=False)
    plan.detach()
    assert seen == ["install {'require_cuda': True}", "forms"]


def test_a_plan_remembers_the_key_when_calibration_ends_and_on_detach(monkeypatch):
    from .test_calibration import LENIENT, FakeForm

    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["good"], extra_forms=[FakeForm("good")],
                          timing_cache=False)
    seen: list = []
    monkeypatch.setattr(memo, "remember", lambda: seen.append(len(plan._whole)) or False)
    tiny.forward()  # calibrates, then the whole-model check
    assert seen == [1]  # after the check: every launch of calibration made
    tiny.forward()
    assert seen == [1]
    plan.detach()
    assert seen == [1, 1]
