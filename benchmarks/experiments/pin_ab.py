"""A/B in one run: the Hopper schedule with its exp2s pinned above the P·V wait (``pin=True``, the row sums
stored to shared memory before the wait; see ``_overlapped_step``) against the same kernel without the pin,
where ptxas places the wait before the first exp2. Both come from the working tree (``pin`` is a launch flag).
Per shape and mode, interleaved rounds of do_bench medians on random bf16 inputs, with cuDNN SDPA (and
flash-attn-4 where it imports) timed in the same run, and the cosine to a float32 reference on a fresh input set,
and whether each variant's output has the same bits as the first variant's (on that input set; for lists, on
the timed inputs). Then block lists at LTX (192 query rows, the selector's height there): random ascending
lists of L key blocks per row, pinned and not, to see how time grows with L.

    python benchmarks/experiments/pin_ab.py --out DIR [--rounds 2] [--shapes ltx wan] [--modes plain fp8 int8]
        [--variants pin=0 pin=1 | soft_exp2=0 soft_exp2=8 ...]

``--variants``: the launch flags compared (``hopper_attention`` keywords, integers; by default the pin off and
on); ``default`` is the launch as ditgate's forms make it, ``before`` the same from the module file
``--before`` names (an earlier commit's kernel, written beside this file and not kept in the tree: ``git show
COMMIT:ditgate/kernels/hopper_attention.py | sed 's/^from .quant_attention/from
ditgate.kernels.quant_attention/' > benchmarks/experiments/hopper_attention_before.py``). Call a of results
2026-12-03-h200-s8 ran the default; calls e and f compared ``soft_exp2`` (an option of commit 02611ce, since
removed) and ``schedule``."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton.testing

from ditgate.kernels.hopper_attention import ROWS_K, hopper_attention
from json_rows import recorder  # beside this script (its directory is on the path)
from module_file import load_module

SHAPES = {"ltx": (32, 27588, 64, 3), "wan": (40, 32760, 128, 2)}  # heads, sequence, head dim, warpgroups


def inputs(h, s, d):
    return tuple(torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))


def cosine(out, ref, heads=4):
    return torch.nn.functional.cosine_similarity(out[:, :heads].float().flatten(), ref.flatten(), dim=0).item()


def exact_baselines(q, k, v):
    """(name, callable) for cuDNN SDPA and, where it imports, flash-attn-4 on the same tensors."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    found = [("cudnn", cudnn)]
    try:
        from flash_attn.cute import flash_attn_func

        qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))  # B, S, H, D storage as the kernel reads it
        found.append(("fa4", lambda: flash_attn_func(qs, ks, vs)))
    except Exception as exc:  # noqa: BLE001 - a missing package is a row left out, said once
        print(f"fa4 left out: {type(exc).__name__}: {exc}", flush=True)
    return found


def random_lists(h, n_m, n_n, keep, seed=5):
    g = torch.Generator(device="cuda").manual_seed(seed)
    idx = torch.argsort(torch.rand(1, h, n_m, n_n, device="cuda", generator=g), dim=-1)[..., :keep]
    return (idx.sort(dim=-1).values.to(torch.int32).contiguous(),
            torch.full((1, h, n_m), keep, dtype=torch.int32, device="cuda"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--modes", nargs="+", default=["plain", "fp8", "int8"])
    ap.add_argument("--schedules", nargs="+", type=int, default=[3])
    ap.add_argument("--list-lengths", nargs="*", type=int, default=[16, 65, 108, 216])
    ap.add_argument("--variants", nargs="+", default=["pin=0", "pin=1"],
                    help="hopper_attention keywords per variant, name=integer[,name=integer], default or before")
    ap.add_argument("--before", help="a module file with an earlier hopper_attention, for the variant 'before'")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    record, rows = recorder(out_dir, "pin-ab.json", "benchmarks/experiments/pin_ab.py")
    variants = [{} if spec == "default" else {"before": 1} if spec == "before" else
                {k: int(v) for k, v in (item.split("=") for item in spec.split(","))}
                for spec in args.variants]  # "default": the launch as ditgate's forms make it
    kernels = {0: hopper_attention}
    if args.before:
        kernels[1] = load_module(args.before, "hopper_attention_before").hopper_attention

    def attend(*tensors, before=0, **call):
        return kernels[before](*tensors, **call)
    for flags in variants:
        for name in ("pin", "tc_sum", "tree_max", "byte_p", "lazy", "int_max"):
            if name in flags:
                flags[name] = bool(flags[name])


    for shape in args.shapes:
        h, s, d, groups = SHAPES[shape]
        flops = 4.0 * h * s * s * d
        q, k, v = inputs(h, s, d)
        for name, fn in exact_baselines(q, k, v):
            ms = triton.testing.do_bench(fn, warmup=25, rep=200)
            record(shape=shape, form=name, ms=ms, tflops=flops / ms * 1e-9)
        for qk in args.modes:
            cq, ck, cv = inputs(h, s, d)
            ref = torch.nn.functional.scaled_dot_product_attention(cq[:, :4].float(), ck[:, :4].float(), cv[:, :4].float())
            first = {}
            for rnd in range(args.rounds):
                for sched, flags in ((sched, flags) for sched in args.schedules for flags in variants):
                    call = {**dict(qk=qk, schedule=sched, groups=groups), **flags}  # a variant may set groups
                    cos = same = None
                    if rnd == 0:
                        out = attend(cq, ck, cv, **call)
                        cos = cosine(out, ref)
                        same = torch.equal(out, first.setdefault(sched, out))  # bits of the first variant's output
                    ms = triton.testing.do_bench(lambda: attend(q, k, v, **call), warmup=25, rep=200)
                    record(shape=shape, form=f"hopper-{qk}", schedule=sched, **flags, round=rnd, ms=ms,
                           tflops=flops / ms * 1e-9, cosine=cos, same_bits=same)
        if shape != "ltx" or not args.list_lengths:
            continue
        n_m, n_n = -(-s // (64 * groups)), -(-s // ROWS_K)
        for qk in [m for m in args.modes if m in ("plain", "fp8")]:
            for length in args.list_lengths:
                idx, cnt = random_lists(h, n_m, n_n, min(length, n_n))
                first = None
                for flags in variants:
                    call = {**dict(qk=qk, groups=groups, kv_index=idx, kv_count=cnt), **flags}
                    out = attend(q, k, v, **call)
                    first = out.clone() if first is None else first
                    ms = triton.testing.do_bench(lambda: attend(q, k, v, **call), warmup=10, rep=100)
                    record(shape=shape, form=f"hopper-{qk}-lists", blocks=min(length, n_n), of=n_n, **flags,
                           ms=ms, same_bits=torch.equal(out, first))
    names = sorted({name for flags in variants for name in flags})
    print("\nshape  form              sched " + " ".join(f"{n[:5]:>5}" for n in names)
          + "  round      ms   TFLOP/s  cosine  same bits as the first variant")
    for r in rows:
        extra = f"{r.get('blocks', '')}/{r.get('of', '')}" if "blocks" in r else f"{r.get('schedule', '')}"
        flags = " ".join(f"{str(r.get(n, '')):>5}" for n in names)
        print(f"{r['shape']:5}  {r['form']:17} {extra:>7} {flags} {r.get('round', ''):>2} "
              f"{r['ms']:8.3f} {r.get('tflops', 0):8.1f}  {r.get('cosine') or ''}  {r.get('same_bits', '')}")


if __name__ == "__main__":
    main()
