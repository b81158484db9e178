"""``gate.compiles.watch_compiles``: the Triton compiles and cache loads that ``bench calibration`` reports.

Compiling needs no GPU: the kernel is compiled for sm_90 (Triton ships its own ptxas) in a child process without
``TRITON_INTERPRET`` (which conftest sets), against a fresh cache folder, so the first compile really builds."""

import textwrap

from .helpers import compiled_child

CHILD = textwrap.dedent("""
    import json
    import torch
    import triton
    import triton.language as tl
    from triton import knobs
    from ditgate.gate.compiles import watch_compiles
    from ditgate.kernels.launches import launches_of
    from ditgate.kernels.same_code import compiled_for_hopper

    @triton.jit
    def scale_rows(X, OUT, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(OUT + i, tl.load(X + i, mask=i < n) * 2.0, mask=i < n)

    x = torch.empty(64)
    (launch,) = launches_of(lambda: scale_rows[(1,)](x, x, 64, BLOCK=64))
    seen = []
    knobs.compilation.listener = lambda **kw: seen.append(kw["cache_hit"])  # a listener set before: chained
    rounds = []
    for _ in range(2):
        with watch_compiles() as tally:
            compiled_for_hopper(*launch)
        rounds.append(tally.result().__dict__)
    print(json.dumps({"rounds": rounds, "chained": seen, "restored": knobs.compilation.listener is not None
                      and knobs.compilation.listener.__name__ == "<lambda>"}))
""")


def test_compiles_are_counted_then_loads_from_the_cache(tmp_path):
    got = compiled_child(tmp_path, CHILD, "compile_twice.py", timeout=300)
    first, second = got["rounds"]
    assert (first["compiled"], first["loaded"]) == (1, 0)
    assert first["compile_s"] > 0 and set(first["by_kernel"]) == {"scale_rows"}
    assert (second["compiled"], second["loaded"]) == (0, 1) and second["by_kernel"] == {}
    assert got["chained"] == [False, True]  # the listener set before still heard both
    assert got["restored"]


def test_without_triton_listener_the_tally_stays_empty(monkeypatch):
    from ditgate.gate import compiles

    monkeypatch.setattr(compiles.importlib.util, "find_spec", lambda name: None)
    with compiles.watch_compiles() as tally:
        pass
    result = tally.result()
    assert (result.compiled, result.loaded) == (0, 0)
    assert result.text() == "no Triton kernel compiled or loaded"
