"""The host's share of a quantized attention call on the GPU machine: how long the CPU takes to enqueue each
part, and what a call costs when nothing else is queued, at the Wan-14B and LTX long shapes (FP8, random bf16
inputs in diffusers' [B, S, H, D] storage).

Why: at LTX, the FP8 sparse form's whole call at budget 0.3 measured 0.46-0.88 ms slower one call at a time
than back to back (benchmarks/results/2026-12-03-h200-s12): its short kernels wait for the host between them.

- enqueue (us): the CPU time of one call while the GPU is held busy (``torch.cuda._sleep`` queued first, so
  no launch waits for the GPU), median of ``--calls``;
- alone (ms): one call and a synchronize, median of ``--calls``: what a caller that waits for each call sees;
- back to back (ms): ``triton.testing.do_bench``'s median.

Parts: the quantization pass, the tile means from its sums, the selection from them, ``plan_launch``, the kernel's
launch from a planned ``Launch``, and the form's whole calls (``fp8`` dense; ``fp8_sparse`` with the selection
pooled by its quantization, as a plan runs it). ``--variants memo nomemo``: the forms with their workspace keeping
the launch's descriptors and tile of ones between calls (``WorkspacePool.memo``) or remaking them every call.

    python benchmarks/experiments/host_costs.py --out DIR [--shapes ltx wan] [--variants memo nomemo] [--rounds 2]

Prints a table last, writes host-costs.json."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import triton.testing

from ditgate.forms.workspace import WorkspacePool
from ditgate.kernels import hopper_attention as ha
from ditgate.sparse.layout import TokenLayout
from ditgate.sparse.selector import TileSelector
from fixed_costs import SHAPES, random_inputs  # beside this script, as the helpers below
from json_rows import recorder
from module_file import load_module

BUDGET = 0.3


def enqueue_us(fn, calls: int) -> float:
    """Median CPU time of one call of ``fn`` with the GPU held busy by a long sleep queued first."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(3e9))  # about 1.5 s of the GPU's clock: every launch below queues behind it
    times = []
    for _ in range(min(calls, 20)):  # at most 20 whole calls queued: under the 1024 launches a stream holds
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def alone_ms(fn, calls: int) -> float:
    """Median wall time of one call followed by a synchronize, the queue empty before each."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def forms(variant: str):
    """The ``fp8`` and ``fp8_sparse`` forms, their workspace keeping launch objects or not."""
    from ditgate.forms import create_forms

    made = create_forms(["fp8", "fp8_sparse"])
    for form in made.values():
        if not form.availability().available:
            raise SystemExit(form.availability().reason)
        form._buffers(torch.device("cuda"))  # makes the workspace
        if variant == "nomemo":
            form._pool.memo = lambda key, make: make()  # every call remakes what the workspace would keep
    return made["fp8"], made["fp8_sparse"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--variants", nargs="+", default=["memo", "nomemo"], choices=["memo", "nomemo"])
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the whole calls per variant")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--before-quant", help="a module file with an earlier quant_attention, whose quantize is timed "
                    "beside this one's (not kept in the tree: git show REV:ditgate/kernels/quant_attention.py | sed "
                    "'s/^from .lists import/from ditgate.kernels.lists import/' > FILE)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record, rows = recorder(out, "host-costs.json", "benchmarks/experiments/host_costs.py")
    from ditgate.forms import AttentionInputs
    from ditgate.forms.base import describe_call

    for shape in args.shapes:
        _, s, _, groups = SHAPES[shape]
        q, k, v, scale, rows_q = random_inputs(shape)
        layout, selector = TokenLayout.video_then(s), TileSelector(ha.ROWS_K)
        qz = ha.quantize_for_schedule(q, k, v, "fp8", scale, sums=True)
        means = qz.tile_means(rows_q, s, s)
        lists = selector.select(q, k, layout, BUDGET, rows_q, lambda: means)
        o = torch.empty_like(q)
        launch = ha.plan_launch(q, k, v, "fp8", scale, o, qz, lists.kv_index, lists.kv_count, groups=groups)
        pool = WorkspacePool()  # keeps the descriptors of qz's copies, as a form's workspace does of its own
        parts = {
            "quantize (sums)": lambda: ha.quantize_for_schedule(q, k, v, "fp8", scale, sums=True),
            "tile means from the sums": lambda: qz.tile_means(rows_q, s, s),
            "selection from the means": lambda: selector.select(q, k, layout, BUDGET, rows_q, lambda: means),
            "plan_launch (lists)": lambda: ha.plan_launch(q, k, v, "fp8", scale, o, qz, lists.kv_index,
                                                          lists.kv_count, groups=groups),
            "plan_launch (lists), kept": lambda: ha.plan_launch(q, k, v, "fp8", scale, o, qz, lists.kv_index,
                                                                lists.kv_count, groups=groups, memo=pool.memo),
            "kernel launch (lists)": launch.run,
        }
        if args.before_quant:
            before = load_module(args.before_quant, "quant_attention_before")
            config = before.KernelConfig(ha.ROWS_HALF, ha.ROWS_K)
            parts["quantize (sums), before"] = lambda: before.quantize(q, k, v, "fp8", scale, config, permute_v=True,
                                                                       sums=True)
        for name, fn in parts.items():
            record(shape=shape, part=name, variant="", enqueue_us=enqueue_us(fn, args.calls),
                   alone_ms=alone_ms(fn, args.calls), b2b_ms=triton.testing.do_bench(fn, warmup=25, rep=100))
        call = describe_call(q, k, v, None, 0.0, False, False, torch.cuda.get_device_capability())
        made = {variant: forms(variant) for variant in args.variants}
        outputs = {}
        for r in range(args.rounds):
            for variant, (dense, sparse) in made.items():
                def whole_sparse(sparse=sparse):
                    tiles = sparse.pool_for_selection(call, AttentionInputs(q, k, v, scale=scale), rows_q, ha.ROWS_K)
                    picked = selector.select(q, k, layout, BUDGET, rows_q, lambda: (tiles.query, tiles.key))
                    return sparse.run(AttentionInputs(q, k, v, scale=scale, attn_mask=picked, prepared=tiles.prepared))

                def whole_dense(dense=dense):
                    return dense.run(AttentionInputs(q, k, v, scale=scale))

                for name, fn in (("fp8_sparse whole call", whole_sparse), ("fp8 whole call", whole_dense)):
                    outputs.setdefault(name, {})[variant] = fn()
                    record(shape=shape, part=name, variant=variant, round=r, enqueue_us=enqueue_us(fn, args.calls),
                           alone_ms=alone_ms(fn, args.calls), b2b_ms=triton.testing.do_bench(fn, warmup=25, rep=100))
        for name, by_variant in outputs.items():
            first = next(iter(by_variant.values()))
            record(shape=shape, part=name, variant="same bits", same=all(torch.equal(first, x)
                                                                         for x in by_variant.values()))
        del q, k, v, qz, o, made, outputs
        torch.cuda.empty_cache()
    print(f"{'shape':<6}{'part':<28}{'variant':<10}{'round':>6}{'enqueue us':>12}{'alone ms':>10}{'b2b ms':>9}")
    for r in rows:
        if "same" in r:
            print(f"{r['shape']:<6}{r['part']:<28}same bits across variants: {r['same']}")
            continue
        print(f"{r['shape']:<6}{r['part'][:27]:<28}{r['variant']:<10}{r.get('round', ''):>6}{r['enqueue_us']:>12.1f}"
              f"{r['alone_ms']:>10.3f}{r['b2b_ms']:>9.3f}")


if __name__ == "__main__":
    main()
