"""Where a quantized block-sparse call's time goes besides its key blocks, on the GPU, at the Wan-14B and LTX
long shapes (random bf16 inputs in diffusers' [B, S, H, D] storage; FP8, or ``--mode`` for the kernel alone):

- ``quantize_for_schedule`` alone, without and with the selector's sums (``sums=True``);
- the selection alone: the selector pooling Q and K itself, and from tile means given (what is left of it
  when the form's quantization pass pools);
- the Hopper kernel alone (copies made beforehand, launched from ``plan_launch``) over random ascending lists
  of L key blocks per query block and dense, in ``--kernel-rounds`` rounds of turned orders (``kernel_rounds``);
  a least-squares line through the list medians gives the cost per key block and the part that does not grow
  with L (per-program prologue and epilogue, launch), and each list's median over dense's with the same flags
  is set against the issue's bound (1.15 x density).

    python benchmarks/experiments/fixed_costs.py --out DIR [--shapes ltx wan]
        [--kernel-rounds 3] [--whole-rounds 3 [--whole-only]] [--kernel-only] [--blocks 0 1 2 27]
        [--variants default lazy=0] [--mode plain]

``--variants`` (``plan_launch`` keywords) are timed in the same rounds, and their outputs compared bit for bit with
the first variant's.

``triton.testing.do_bench`` medians; prints a table last, writes fixed-costs.json."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton.testing

from ditgate.kernels import hopper_attention as ha
from ditgate.sparse.layout import TokenLayout
from ditgate.sparse.selector import TileSelector
from json_rows import recorder  # beside this script (its directory is on the path)

SHAPES = {"ltx": (32, 27588, 64, 3), "wan": (40, 32760, 128, 2)}  # heads, sequence, head dim, warpgroups
FRACTIONS = (0.125, 0.25, 0.3, 0.5, 1.0)


def random_inputs(shape: str):
    """Q, K, V of one of ``SHAPES`` (random bf16 in diffusers' [B, S, H, D] storage, seen as B, H, S, D), the
    softmax scale and the query rows per list tile."""
    h, s, d, groups = SHAPES[shape]
    q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    return q, k, v, d ** -0.5, 64 * groups


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def kernel_rounds(launches: dict, rounds: int, record) -> dict:
    """Each launch timed once per round, the order reversed every other round and turned by the round's number, so
    that no launch always runs after minutes of load (a fixed order, dense first and the longest list last, had
    made every block listed look 4.7-8.7 % slower than dense on the H200, where Nsight Compute counted the same
    cycles). Records every round; returns each launch's median."""
    keys = list(launches)
    times: dict = {key: [] for key in keys}
    for r in range(rounds):
        base = keys[::-1] if r % 2 else keys
        for key in base[r % len(keys):] + base[:r % len(keys)]:
            launch = launches[key]
            ms = bench(launch.run)
            times[key].append(ms)
            record(part=key[0], blocks=key[1], round=r, ms=ms)
    return {key: sorted(t)[len(t) // 2] for key, t in times.items()}


def same_bits(launches: dict, out: torch.Tensor, record) -> None:
    """Whether each variant's output has the bits of the first variant's launch of the same part and list."""
    first: dict = {}
    for (part, blocks), launch in launches.items():
        out.fill_(float("nan"))
        launch.run()
        what = (part.split(": ", 1)[1], blocks)
        if what in first:
            same = torch.equal(out, first[what])
            extra = {} if same else {"cosine_to_first": torch.nn.functional.cosine_similarity(
                out.flatten().double(), first[what].flatten().double(), dim=0).item()}
            record(part=part, blocks=blocks, same_bits_as_first=same, **extra)
        else:
            first[what] = out.clone()


def _probed(name: str):
    """A fresh form of ``name``, its availability checked (the probe also loads the kernels the form runs)."""
    from ditgate.forms import create_forms

    form = create_forms([name])[name]
    if not form.availability().available:
        raise SystemExit(form.availability().reason)
    return form


def selecting_call(form, q, k, v, scale, rows_q):
    """A sparse form's whole call at budget 0.3 over a video layout, as a plan runs it with the selector pooling Q and
    K itself: the selection, then the form's kernel over its lists."""
    from ditgate.forms import AttentionInputs

    layout, selector = TokenLayout.video_then(q.shape[2]), TileSelector(ha.ROWS_K)

    def call():
        return form.run(AttentionInputs(q, k, v, scale=scale, attn_mask=selector.select(q, k, layout, 0.3, rows_q)))
    return call


def whole_call_variants(q, k, v, scale, rows_q) -> dict:
    """The FP8 sparse form's whole call at budget 0.3 over a video layout, as a plan runs it, two ways: the selector
    pooling Q and K itself (``selecting_call``) and the form's quantization pooling for it (``Form.pool_for_selection``).
    Prints the cosine of an output that has not the first's bits: the selector's own tile means (each tile's rows summed at
    once) and the quantization's (per block of 64 or 128 rows, then per tile) round apart, and where two tiles'
    scores nearly tie, a row may keep the other (seen at Wan-14B)."""
    from ditgate.forms import AttentionInputs
    from ditgate.forms.base import describe_call

    form = _probed("fp8_sparse")
    layout, selector = TokenLayout.video_then(q.shape[2]), TileSelector(ha.ROWS_K)
    call = describe_call(q, k, v, None, 0.0, False, False, torch.cuda.get_device_capability())
    x = AttentionInputs(q, k, v, scale=scale)
    own = selecting_call(form, q, k, v, scale, rows_q)

    def pooled():
        tiles = form.pool_for_selection(call, x, rows_q, ha.ROWS_K)
        lists = selector.select(q, k, layout, 0.3, rows_q, lambda: (tiles.query, tiles.key))
        return form.run(AttentionInputs(q, k, v, scale=scale, attn_mask=lists, prepared=tiles.prepared))

    first, out = own(), pooled()
    if not torch.equal(first, out):
        cosine = torch.nn.functional.cosine_similarity(first.float().flatten(), out.float().flatten(), dim=0)
        print(f"quantization pools: not the bits of the selector pooling itself, cosine {cosine.item():.7f}")
    return {"whole call, selector pools": own, "whole call, quantization pools": pooled}


def whole_calls(q, k, v, scale, rows_q, rounds, record):
    """``whole_call_variants`` back to back, alternating, ``rounds`` times each."""
    variants = whole_call_variants(q, k, v, scale, rows_q)
    for r in range(rounds):
        for name, fn in variants.items():
            record(part=name, round=r, ms=bench(fn), same_bits=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--whole-rounds", type=int, default=0, help="then the FP8 sparse form's whole call at budget 0.3, "
                    "the selector pooling itself or the form's quantization pooling for it, interleaved rounds")
    ap.add_argument("--whole-only", action="store_true", help="only the whole calls")
    ap.add_argument("--kernel-rounds", type=int, default=3, help="rounds of the kernel-alone launches, in turned "
                    "orders (medians fitted)")
    ap.add_argument("--kernel-only", action="store_true", help="no quantization or selection timed apart")
    ap.add_argument("--blocks", nargs="+", type=int, help="list lengths (default: the issue's densities, 0.3 and 1)")
    ap.add_argument("--mode", default="fp8", choices=["fp8", "int8", "plain"], help="the kernel's mode (the "
                    "kernel-alone launches)")
    ap.add_argument("--variants", nargs="+", default=["default"], help="plan_launch keywords per variant, "
                    "name=integer[,name=integer] (booleans as 0 and 1), or default")
    args = ap.parse_args()
    variants = {spec: {} if spec == "default" else {k: int(v) for k, v in (x.split("=") for x in spec.split(","))}
                for spec in args.variants}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record, rows = recorder(out, "fixed-costs.json", "benchmarks/experiments/fixed_costs.py")

    for shape in args.shapes:
        h, s, _, groups = SHAPES[shape]
        q, k, v, scale, rows_q = random_inputs(shape)
        if args.whole_rounds:
            whole_calls(q, k, v, scale, rows_q, args.whole_rounds, lambda **row: record(shape=shape, **row))
        if args.whole_only:
            continue
        if not args.kernel_only:
            aux_parts(q, k, v, scale, rows_q, s, lambda **row: record(shape=shape, **row))
        mode = args.mode
        qz = None if mode == "plain" else ha.quantize_for_schedule(q, k, v, mode, scale, sums=True)
        n_m, n = -(-s // rows_q), -(-s // ha.ROWS_K)
        o = torch.empty_like(q)
        lists = {}
        g = torch.Generator(device="cuda").manual_seed(7)
        lengths = args.blocks if args.blocks is not None else [max(1, round(f * n)) for f in FRACTIONS]
        for keep in lengths:
            index = torch.argsort(torch.rand(1, h, n_m, n, device="cuda", generator=g), -1)[..., :max(keep, 1)]
            lists[keep] = (index.sort(-1).values.to(torch.int32).contiguous(),
                           torch.full((1, h, n_m), keep, dtype=torch.int32, device="cuda"))
        launches = {}
        for spec, flags in variants.items():
            dense = ha.plan_launch(q, k, v, mode, scale, o, qz, groups=groups, **flags)
            launches[(f"{spec}: dense", n)] = dense
            if dense.flags["LAZY"]:  # the lists rescale every block (``LAZY_RESCALED``): dense doing the same too
                launches[(f"{spec}: dense, lazy off", n)] = ha.plan_launch(
                    q, k, v, mode, scale, o, qz, groups=groups, **{**flags, "lazy": False})
            for keep, (index, count) in lists.items():
                launches[(f"{spec}: lists", keep)] = ha.plan_launch(q, k, v, mode, scale, o, qz, index, count,
                                                                   groups=groups, **flags)
        if len(variants) > 1:
            same_bits(launches, o, lambda **row: record(shape=shape, **row))
        medians = kernel_rounds(launches, args.kernel_rounds, lambda **row: record(shape=shape, **row))
        for (part, blocks), ms in medians.items():
            record(shape=shape, part=f"{part} (median)", blocks=blocks, median_ms=ms)
        for spec in variants:
            fit_and_ratios(medians, spec, n, n_m * h, lambda **row: record(shape=shape, **row))
        del q, k, v, qz, o
        torch.cuda.empty_cache()
    print(f"{'shape':<6}{'part':<48}{'blocks':>7}{'round':>6}{'ms':>9}")
    for r in rows:
        if "round" in r and "blocks" in r:  # the kernel rounds: in the JSON; their medians are printed
            continue
        head = f"{r['shape']:<6}{r['part'][:47]:<48}"
        if "ratio" in r:
            print(f"{head}{r['blocks']:>7}{'':>6} {r['ratio']:.4f} of dense (bound {r['bound']:.4f})")
        elif "median_ms" in r:
            print(f"{head}{r['blocks']:>7}{'median':>6}{r['median_ms']:>9.3f}")
        elif "same_bits_as_first" in r:
            cosine = f" (cosine {r['cosine_to_first']:.7f})" if "cosine_to_first" in r else ""
            print(f"{head}{r['blocks']:>7}{'':>6} same bits as the first variant: {r['same_bits_as_first']}{cosine}")
        elif "ms" in r:
            print(f"{head}{r.get('blocks', ''):>7}{r.get('round', ''):>6}{r['ms']:>9.3f}")
        else:
            print(f"{head} {r['ms_per_block']:.4f} ms/block + {r['fixed_ms']:.3f} ms "
                  f"({r['fixed_us_per_program_per_sm']:.2f} us per program per SM)")


def aux_parts(q, k, v, scale, rows_q, s, record):
    """The quantization and the selection, each alone."""
    for sums in (False, True):
        record(part=f"quantize (sums={sums})",
               ms=bench(lambda sums=sums: ha.quantize_for_schedule(q, k, v, "fp8", scale, sums=sums)))
    qz = ha.quantize_for_schedule(q, k, v, "fp8", scale, sums=True)
    layout = TokenLayout.video_then(s)
    selector = TileSelector(ha.ROWS_K)
    means = qz.tile_means(rows_q, s, s)
    record(part="selection, pooling Q and K itself", ms=bench(lambda: selector.select(q, k, layout, 0.3, rows_q)))
    record(part="selection from given tile means",
           ms=bench(lambda: selector.select(q, k, layout, 0.3, rows_q, lambda: means)))
    record(part="tile means from the sums", ms=bench(lambda: qz.tile_means(rows_q, s, s)))


def fit_and_ratios(medians: dict, spec: str, n: int, programs: int, record) -> None:
    """A least-squares line through one variant's list medians (lists of at least one block), and each list's
    median over its dense launch with the same flags, against the issue's bound."""
    points = [(keep, ms) for (part, keep), ms in medians.items() if part == f"{spec}: lists" and keep > 0]
    if len(points) >= 2:
        xs = torch.tensor([p[0] for p in points], dtype=torch.float64)
        ys = torch.tensor([p[1] for p in points], dtype=torch.float64)
        slope = (((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum()).item()
        intercept = (ys.mean() - slope * xs.mean()).item()
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        record(part=f"{spec}: fit over the lists", ms_per_block=slope, fixed_ms=intercept, programs=programs,
               fixed_us_per_program_per_sm=intercept * 1e3 * sms / programs)
    same_flags = medians.get((f"{spec}: dense, lazy off", n), medians[(f"{spec}: dense", n)])
    for keep, ms in points:
        record(part=f"{spec}: lists over dense (same flags), medians", blocks=keep, ratio=ms / same_flags,
               bound=1.15 * keep / n)


if __name__ == "__main__":
    main()
