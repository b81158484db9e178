"""Compile the Hopper schedule for sm_90 on any machine, and say what ptxas made of it.

Gluon has no CPU interpreter, so this is what a machine without a Hopper GPU can check: that every mode
and head dim compiles (Triton ships its own ptxas), how many registers and how much shared memory it
takes, whether anything spills, and how wide the output's stores are. Run it in a process without
``TRITON_INTERPRET=1`` (the interpreter replaces Triton's library functions with Python ones that the
compiler cannot take):

    python -m ditgate.kernels.hopper_compile [--pin | --tree-max | --int-max | --lazy]

With an option, the steady-state step of the variants where that option matters, compiled with it off and on
(``LoopShape``: its length, where ptxas put the waits for the tensor-core products against the exp2s): what the
option changes in the machine code. ``python -m ditgate.kernels.same_code REF`` compares
the code of every default launch against another commit's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch

from . import hopper_attention as ha
from .quant_attention import Quantized
from .launches import launches_of
from .same_code import nvidia_tool, compiled_for_hopper

HOPPER_SMEM = 232448  # bytes of shared memory one block may use on sm_90


@dataclass(frozen=True)
class CompileReport:
    qk: str
    head_dim: int
    sparse: bool
    groups: int  # consumer warpgroups (64 query rows each)
    shared_bytes: int
    registers: int
    spill_bytes: int
    wgmma: int  # warpgroup matrix instructions in the PTX
    setmaxnreg: int  # per-partition register budgets in the PTX
    shuffles: int  # warp shuffles in the PTX (row max and sum; an FP8 P moved between threads adds more)
    wgmma_serialized: bool  # ptxas's C7511: it waits for every product right after issuing it (a silent slowdown)
    # the output's stores in the PTX, by width: (16-byte st.global.v4, narrower st.global); the Hopper schedule's own
    # copy of V lets each thread write eight neighbouring channels at once (``hopper_kernel._ordered_output``)
    wide_stores: int
    narrow_stores: int
    aligned_out: bool  # every row of the output starts on 16 bytes (``hopper_attention.rows_aligned``)


def host_launch(qk: str, head_dim: int, sparse: bool, groups: int = 2, aligned_out: bool = True,
                **options) -> ha.Launch:
    """The launch a [1, S, 2, D] bf16 call makes, on CPU tensors (only shapes, strides, dtypes matter).
    ``aligned_out`` False: an output whose rows start 8 bytes into 16 (``hopper_attention.rows_aligned``).
    ``options``: ``plan_launch``'s (``pin``, ``tree_max``, ``lazy``, ``int_max``, ``gather_out``)."""
    S, H, D = 1000, 2, head_dim
    q = torch.empty(1, S, H, D, dtype=torch.bfloat16).transpose(1, 2)
    out = torch.empty_like(q) if aligned_out else torch.empty(1, S, H, D + 4, dtype=q.dtype)[..., 4:].transpose(1, 2)
    n = -(-S // ha.ROWS_Q)
    n_m = -(-S // (ha.ROWS_HALF * groups))  # query blocks of the lists: the program's rows
    qz = None
    if qk != "plain":
        e = torch.float8_e4m3fn if qk == "fp8" else torch.int8
        pad = n * ha.ROWS_Q
        qz = Quantized(torch.empty(H, pad, D, dtype=e), torch.empty(H, pad // ha.ROWS_HALF),
                       torch.empty(H, pad, D, dtype=e), torch.empty(H, n),
                       torch.empty(H, D, pad, dtype=torch.float8_e4m3fn), torch.empty(H, D), pad, pad,
                       permuted_v=True)
    lists = (torch.zeros(1, H, n_m, n, dtype=torch.int32), torch.zeros(1, H, n_m, dtype=torch.int32)) if sparse else (None,) * 2
    return ha.plan_launch(q, q, q, qk, D ** -0.5, out, qz, *lists, groups=groups, **options)


def _compile(qk: str, head_dim: int, sparse: bool, groups: int = 2, aligned_out: bool = True, **options):
    """The compiled kernel and the compile-time flags it was compiled with (as ``plan_launch`` decides them)."""
    launch = host_launch(qk, head_dim, sparse, groups, aligned_out, **options)
    (recorded,) = launches_of(launch.run)
    return compiled_for_hopper(*recorded), launch.flags


def _assemble(ptx: str, tmp: str) -> tuple[str, str]:
    """ptxas on the PTX: (its -v report, the cubin's path)."""
    path, cubin = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
    with open(path, "w") as f:
        f.write(ptx)
    info = subprocess.run([nvidia_tool("ptxas"), "-v", "--gpu-name", "sm_90a", path, "-o", cubin], capture_output=True,
                          text=True, check=True).stderr
    return info, cubin


def _spills(info: str) -> int:
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", info))


def compile_report(qk: str, head_dim: int, sparse: bool, groups: int = 2, aligned_out: bool = True) -> CompileReport:
    compiled, _ = _compile(qk, head_dim, sparse, groups=groups, aligned_out=aligned_out)
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        info, _ = _assemble(ptx, tmp)
    spills = _spills(info)
    registers = max(int(n) for n in re.findall(r"Used (\d+) registers", info))
    stores = re.findall(r"\bst\.global\.(\S+)", ptx)
    wide = sum(kind.startswith("v4.") for kind in stores)
    return CompileReport(qk, head_dim, sparse, groups, compiled.metadata.shared, registers, spills,
                         ptx.count("wgmma.mma_async"), ptx.count("setmaxnreg"), ptx.count("shfl.sync"),
                         "wgmma.mma_async instructions are serialized" in info, wide, len(stores) - wide, aligned_out)


@dataclass(frozen=True)
class LoopShape:
    """One key block's step in the machine code (SASS) of a consumer's loop: its length in instructions,
    and where the waits for the tensor-core products (``WARPGROUP.DEPBAR.LE gsb0, N``: at most N groups
    left in flight) and the exp2s (``MUFU.EX2``) sit, as positions from the step's first product."""

    qk: str
    head_dim: int
    groups: int
    sparse: bool
    pin: bool  # the exp2s pinned above the P·V wait (``_overlapped_step``)
    tree_max: bool  # each row's max as a tree of pairwise maxima (``hopper_softmax._row_max``)
    lazy: bool  # the output rescaled only where a row's max moved (``hopper_softmax._rows_rescaled``)
    int_max: bool  # INT8's row max over the integer products (``hopper_config.INT_MAXED``)
    spill_bytes: int
    instructions: int  # to the next fresh Q·Kᵀ product: the loop's body and what follows its branch back
    loop_instructions: int  # to the branch back: the body alone
    max_chain: int  # the longest chain of dependent float maxima (FMNMX) in the step
    integer_maxima: int  # integer maxima in the body, two-input (VIMNMX) and three-input (VIMNMX3)
    waits: tuple[tuple[int, int], ...]  # (position, groups left in flight)
    first_exp2: int
    last_exp2: int
    exp2s: int  # in the loop's body
    skippable_multiplies: int  # FMULs in the body a warp jumps over behind a vote (``lazy``: the output's rescale)


def loop_shape(qk: str, head_dim: int, groups: int = 2, sparse: bool = False, **options) -> LoopShape:
    """Where the waits fall against the softmax in the steady-state step (the second one the SASS holds:
    from one Q·Kᵀ product that starts a fresh accumulator to the next), with ``plan_launch``'s ``options``.
    Why: the step only overlaps the softmax with P·V if the wait for P·V comes after the exp2s; ptxas decides
    that, not the source order (``pin``: see ``_overlapped_step``)."""
    compiled, flags = _compile(qk, head_dim, sparse, groups, **options)
    with tempfile.TemporaryDirectory() as tmp:
        info, cubin = _assemble(compiled.asm["ptx"], tmp)
        sass = subprocess.run([nvidia_tool("cuobjdump"), "--dump-sass", cubin], capture_output=True, text=True,
                              check=True).stdout
    lines = [line for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]+\*/\s+\S", line)]
    addresses = [int(re.match(r"\s*/\*([0-9a-f]+)\*/", line).group(1), 16) for line in lines]
    body = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", line).split(";")[0] for line in lines]
    starts = [i for i, ins in enumerate(body) if re.search(r"GMMA\.\S+ R\d+, gdesc\[UR\d+\], RZ", ins)]
    step = body[starts[1]:starts[2]]
    back = [i for i, ins in enumerate(step) for m in [re.search(r"\bBRA (0x[0-9a-f]+)", ins)]
            if m and int(m.group(1), 16) <= addresses[starts[1] + i]]  # the loop's branch back to its top
    waits = tuple((i, int(m.group(1), 16)) for i, ins in enumerate(step)
                  for m in [re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([0-9a-f]+)", ins)] if m)
    exp2 = [i for i, ins in enumerate(step) if "MUFU.EX2" in ins]
    loop = back[0] + 1 if back else len(step)
    return LoopShape(qk, head_dim, groups, sparse, flags["PIN"], flags["TREE_MAX"], flags["LAZY"], flags["INT_MAX"],
                     _spills(info), len(step), loop,
                     _longest_chain(step, "FMNMX"), sum(ins.split()[0] in ("VIMNMX", "VIMNMX3") for ins in step[:loop]),
                     waits, exp2[0], exp2[-1], sum(i < loop for i in exp2),
                     _skippable(step[:loop], addresses[starts[1]:starts[1] + loop], "FMUL"))


def _skippable(body: list[str], addresses: list[int], opcode: str) -> int:
    """The ``opcode`` instructions that a predicated forward branch right after a warp vote jumps over."""
    total = 0
    for i, ins in enumerate(body):
        if not ins.startswith("VOTE.ANY"):
            continue
        branch = next((j for j in range(i + 1, len(body)) if re.match(r"@!?U?P\d+ BRA", body[j])), None)
        if branch is None:
            continue
        target = int(re.search(r"BRA (?:\S+ )?(0x[0-9a-f]+)", body[branch]).group(1), 16)
        total += sum(1 for ins2, at in zip(body[branch + 1:], addresses[branch + 1:])
                     if at < target and ins2.split()[0] == opcode)
    return total


def _longest_chain(step: list[str], opcode: str) -> int:
    """The most ``opcode`` instructions in a row that each read the one before (through registers; any
    other instruction writing a register ends the chain there)."""
    depth: dict[str, int] = {}
    longest = 0
    for ins in step:
        regs = re.findall(r"\bR\d+\b", ins.split(" ", 1)[-1]) if not ins.startswith("@") else []
        if not regs:
            continue
        if ins.split()[0].split(".")[0] == opcode:
            depth[regs[0]] = 1 + max((depth.get(r, 0) for r in regs[1:]), default=0)
            longest = max(longest, depth[regs[0]])
        else:
            depth[regs[0]] = 0
    return longest


LOOP_MODES = {  # the steady-state steps each option changes, pairwise off and on
    # plain over 192-row lists (pinned by default), with and without the pin
    "--pin": lambda: [loop_shape("plain", 64, 3, True, pin=pin) for pin in (False, True)],
    # each row's max as the compiler's chain or a tree
    "--tree-max": lambda: [loop_shape(qk, 64, 3, tree_max=tree) for qk in ("plain", "fp8") for tree in (False, True)],
    # INT8's row max over the products' floats or over the integers, dense at both head dims' warpgroups
    "--int-max": lambda: [loop_shape("int8", d, groups, int_max=int_max)
                          for d, groups in ((64, 3), (128, 2)) for int_max in (False, True)],
    # the output rescaled every block or only where a row's max moved, in the 8-bit modes and in plain mode over
    # 192-row lists
    "--lazy": lambda: [loop_shape(qk, d, groups, sparse, lazy=lazy)
                       for qk, d, groups, sparse in (("fp8", 64, 3, False), ("int8", 64, 3, False),
                                                     ("fp8", 128, 2, False), ("fp8", 64, 3, True),
                                                     ("plain", 64, 3, True))
                       for lazy in (False, True)],
}


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter's functions cannot be compiled")
    if len(sys.argv) == 2 and sys.argv[1] in LOOP_MODES:
        print(json.dumps([dataclasses.asdict(r) for r in LOOP_MODES[sys.argv[1]]()]))
        return
    reports = [compile_report(qk, d, sparse, groups) for qk in ("plain", "fp8", "int8") for d in (64, 128)
               for sparse, groups in ((False, 2), (True, 2), (False, 3), (True, 3)) if groups == 2 or d == 64]
    reports.append(compile_report("fp8", 64, False, 3, aligned_out=False))  # rows 8 bytes into 16: narrow stores
    print(json.dumps([dataclasses.asdict(r) for r in reports]))


if __name__ == "__main__":
    main()
