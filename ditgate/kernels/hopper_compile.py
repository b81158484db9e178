"""Compile the Hopper schedule for sm_90 on any machine, and say what ptxas made of it.

Gluon has no CPU interpreter, so this is what a machine without a Hopper GPU can check: that every mode
and head dim compiles (Triton ships its own ptxas), how many registers and how much shared memory it
takes, and whether anything spills. Run it in a process without ``TRITON_INTERPRET=1`` (the interpreter
replaces Triton's library functions with Python ones that the compiler cannot take):

    python -m ditgate.kernels.hopper_compile
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch
import triton

from . import hopper_attention as ha
from .quant_attention import Quantized

HOPPER_SMEM = 232448  # bytes of shared memory one block may use on sm_90


@dataclass(frozen=True)
class CompileReport:
    qk: str
    head_dim: int
    sparse: bool
    shared_bytes: int
    registers: int
    spill_bytes: int
    wgmma: int  # warpgroup matrix instructions in the PTX
    setmaxnreg: int  # per-partition register budgets in the PTX


def host_launch(qk: str, head_dim: int, sparse: bool) -> ha.Launch:
    """The launch a [1, S, 2, D] bf16 call makes, on CPU tensors (only shapes, strides, dtypes matter)."""
    S, H, D = 1000, 2, head_dim
    q = torch.empty(1, S, H, D, dtype=torch.bfloat16).transpose(1, 2)
    out = torch.empty_like(q)
    n = -(-S // ha.ROWS_Q)
    qz = None
    if qk != "plain":
        e = torch.float8_e4m3fn if qk == "fp8" else torch.int8
        pad = n * ha.ROWS_Q
        qz = Quantized(torch.empty(H, pad, D, dtype=e), torch.empty(H, n), torch.empty(H, pad, D, dtype=e),
                       torch.empty(H, n), torch.empty(H, D, pad, dtype=torch.float8_e4m3fn), torch.empty(H, D),
                       pad, pad)
    lists = (torch.zeros(1, H, n, n, dtype=torch.int32), torch.zeros(1, H, n, dtype=torch.int32)) if sparse else (None,) * 2
    return ha.plan_launch(q, q, q, qk, D ** -0.5, out, qz, *lists)


def compile_report(qk: str, head_dim: int, sparse: bool) -> CompileReport:
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    launch = host_launch(qk, head_dim, sparse)
    fn = ha._hopper_attn_kernel
    signature = {name: mangle_type(arg) for name, arg in zip(fn.arg_names, launch.args)}
    signature.update({name: "constexpr" for name in launch.flags})
    compiled = triton.compile(GluonASTSource(fn, signature, dict(launch.flags)), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4})
    ptx = compiled.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        info = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull], capture_output=True,
                              text=True, check=True).stderr
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", info))
    registers = max(int(n) for n in re.findall(r"Used (\d+) registers", info))
    return CompileReport(qk, head_dim, sparse, compiled.metadata.shared, registers, spills,
                         ptx.count("wgmma.mma_async"), ptx.count("setmaxnreg"))


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter's functions cannot be compiled")
    reports = [compile_report(qk, d, sparse) for qk in ("plain", "fp8", "int8") for d in (64, 128)
               for sparse in (False, True)]
    print(json.dumps([dataclasses.asdict(r) for r in reports]))


if __name__ == "__main__":
    main()
