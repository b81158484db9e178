"""Whether a change to the kernels changed the machine code that ditgate's forms run by default.

    python -m ditgate.kernels.same_code REF [--keep DIR]      (REF: a commit, e.g. main)

Every kernel launch the forms make with their default options (the Hopper schedule for each mode, head dim and
list height it serves, with the quantization passes before it; the Triton schedule, dense and over 128-row lists,
with its passes; the selector's pooling and choice) is recorded on CPU tensors, specialized by Triton's own binder
for an sm_90 target as a launch on a Hopper GPU would be, and compiled with Triton's ptxas: once from REF's
kernels, once from the working tree's. Each launch's SASS, its PTX without debug lines, and its registers, stack and shared memory are
compared. Identical code is what a refactor of the kernels must show without a GPU; any difference is listed.

Each side runs in a child process (no ``TRITON_INTERPRET``) whose working directory is that side's checkout, with
this file copied into REF's, so only entry points both sides have are used (``hopper_compile.host_launch``,
``hopper_attention.quantize_for_schedule``, ``quant_attention.quantize`` / ``quant_attention`` /
``default_config``, ``tile_select.pool_tiles`` / ``choose_and_list``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .launches import launches_of

SEQ, HEADS = 1000, 2  # a short head: a masked tail block, a partial last query block


def _inputs(head_dim: int):
    """Q, K, V as diffusers hands them over: [B, S, H, D] bf16 storage seen as [B, H, S, D]."""
    import torch

    return tuple(torch.empty(1, SEQ, HEADS, head_dim, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))


def _default_calls():
    """(label, call) for every way the forms launch kernels by default; each call issues its launches."""
    import torch

    from . import hopper_attention as ha
    from . import hopper_compile as hc
    from . import quant_attention as qa
    from . import tile_select

    calls = []
    for qk, d, rows in sorted(ha.FASTER_THAN_TRITON, key=str):
        groups = rows // ha.ROWS_HALF if rows else ha.DEFAULT_GROUPS[d]
        label = f"hopper {qk} d{d} " + (f"lists of {rows} rows" if rows else "dense")

        def hopper(qk=qk, d=d, rows=rows, groups=groups):
            if qk != "plain":  # the form's quantization: with the sums where it pools for the selector
                ha.quantize_for_schedule(*_inputs(d), qk, d ** -0.5, sums=rows is not None)
            hc.host_launch(qk, d, rows is not None, groups).run()

        calls.append((label, hopper))
    for qk in ("fp8", "int8", "plain"):
        for d in (64, 128):
            for sparse in (False, True):
                def triton_schedule(qk=qk, d=d, sparse=sparse):
                    q, k, v = _inputs(d)
                    config = qa.default_config(d, "cuda", qk, 128 if sparse else None, tensors=(q, k, v))
                    kw = {}
                    if sparse:
                        n_m, n_n = -(-SEQ // config.block_m), -(-SEQ // config.block_n)
                        kw = dict(kv_index=torch.zeros(1, HEADS, n_m, n_n, dtype=torch.int32),
                                  kv_count=torch.ones(1, HEADS, n_m, dtype=torch.int32))
                        if qk != "plain":  # pooled for the selector, then handed to the call
                            kw["prepared"] = qa.quantize(q, k, v, qk, d ** -0.5, config, sums=True)
                    qa.quant_attention(q, k, v, qk=qk, config=config, **kw)

                calls.append((f"triton {qk} d{d} {'lists' if sparse else 'dense'}", triton_schedule))
    for d in (64, 128):
        for rows in (128, 192):
            calls.append((f"pooling d{d} {rows} rows",
                          lambda d=d, rows=rows: tile_select.pool_tiles(_inputs(d)[0], rows)))
    for n_m, n in ((8, 8), (144, 216)):  # the selector's choice: a short head's tiles, and LTX's
        def choose(n_m=n_m, n=n):
            tiles = torch.zeros(n_m, n, dtype=torch.int8)
            tile_select.choose_and_list(torch.empty(1, HEADS, n_m, n), tiles, torch.empty(n_m, n), tiles, 3, n)

        calls.append((f"selection {n_m} x {n} tiles", choose))
    return calls


def compiled_for_hopper(fn, args: tuple, kwargs: dict):
    """One launch compiled for sm_90, its arguments specialized by Triton's own launcher code as on a Hopper GPU
    (integers equal to 1 become constants; pointers, strides and descriptors say what they are divisible by):
    what decides, among other things, how wide the stores are."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kwargs = dict(kwargs, debug=kwargs.get("debug", fn.debug) or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    source = (GluonASTSource if fn.is_gluon() else ASTSource)(fn, signature, constexprs, attrs)
    return triton.compile(source, target=target, options=options.__dict__)


def nvidia_tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _machine_code(compiled, tmp: str) -> dict:
    """A compiled kernel's SASS, its PTX without debug lines, and its resources."""
    cubin = os.path.join(tmp, "kernel.cubin")
    with open(cubin, "wb") as f:
        f.write(compiled.asm["cubin"])
    sass = subprocess.run([nvidia_tool("cuobjdump"), "--dump-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
    usage = subprocess.run([nvidia_tool("cuobjdump"), "--dump-resource-usage", cubin], capture_output=True, text=True,
                           check=True).stdout
    return {"kernel": compiled.name, "sass": sass, "ptx": _without_debug(compiled.asm["ptx"]),
            "resources": " ".join(re.findall(r"\b(?:REG|STACK|LOCAL):\d+", usage)
                                  + [f"shared memory {compiled.metadata.shared} bytes"])}


def _without_debug(ptx: str) -> str:
    """The PTX's instructions and declarations: no source lines (``.loc``), no debug sections or labels, no comments."""
    lines = []
    for line in ptx.splitlines():
        if re.match(r"\s*\.(file|section)\b", line):
            break  # the debug sections close the module
        line = line.split("//")[0].rstrip()
        if line and not re.match(r"\s*\.loc\b", line) and not re.match(r"\$L__(tmp|func_\w+)\d*:", line):
            lines.append(line)
    return "\n".join(lines)


def _emit(path: str) -> None:
    """This checkout's default launches and their machine code, as JSON at ``path``."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, call in _default_calls():
            for i, launch in enumerate(launches_of(call)):
                out[f"{label}: launch {i + 1}"] = _machine_code(compiled_for_hopper(*launch), tmp)
    with open(path, "w") as f:
        json.dump(out, f)


def _side(root: Path, out: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    run = subprocess.run([sys.executable, "-m", "ditgate.kernels.same_code", "--emit", out], cwd=root, env=env,
                         capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"collecting the launches in {root} failed:\n{run.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


def compare(ref: str, keep: str | None = None) -> bool:
    """Print, launch by launch, whether REF's kernels and the working tree's compile to the same code."""
    here = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        old_root = Path(tmp) / "ref"
        old_root.mkdir()
        archive = subprocess.run(["git", "archive", ref, "ditgate"], cwd=here, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_root)], input=archive, check=True)
        for helper in ("same_code.py", "launches.py"):  # the recording of launches may be newer than REF
            shutil.copy(Path(__file__).with_name(helper), old_root / "ditgate" / "kernels" / helper)
        old, new = _side(old_root, f"{tmp}/old.json"), _side(here, f"{tmp}/new.json")
    same = old.keys() == new.keys()
    for key in sorted(old.keys() | new.keys()):
        if key not in old or key not in new:
            print(f"{key}: only {'in the working tree' if key in new else 'in ' + ref}")
            continue
        a, b = old[key], new[key]
        parts = [part for part in ("kernel", "resources", "sass", "ptx") if a[part] != b[part]]
        same = same and not parts
        print(f"{key} ({b['kernel']}, {b['resources']}, {b['sass'].count(chr(10))} SASS lines): "
              + ("same" if not parts else "DIFFERENT " + ", ".join(parts)))
        if keep:
            for side, entry in (("ref", a), ("tree", b)):
                stem = Path(keep) / side / re.sub(r"\W+", "_", key)
                stem.parent.mkdir(parents=True, exist_ok=True)
                stem.with_suffix(".sass").write_text(entry["sass"])
                stem.with_suffix(".ptx").write_text(entry["ptx"])
    print(f"{len(new)} launches: " + ("the same code as " + ref if same else "code differs from " + ref))
    return same


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--emit":
        _emit(sys.argv[2])
        return
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--keep"):
        raise SystemExit("usage: python -m ditgate.kernels.same_code REF [--keep DIR]")
    sys.exit(0 if compare(sys.argv[1], sys.argv[3] if len(sys.argv) == 4 else None) else 1)


if __name__ == "__main__":
    main()
