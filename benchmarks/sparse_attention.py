"""The sparse stage on activations captured from the real model classes, on the GPU.

Per model (diffusers' own class at the published configuration with ``--layers`` blocks, random weights,
bf16; the attach path captures the self-attention inputs of the last block through a capturing form):

- exact dense rows: flash-attn-4 (where installed), cuDNN, and ditgate's kernel unquantized ("plain") and
  FP8, all dense (the Triton schedule at its default tile, or its best of a sweep with ``--triton-sweep``);
  on Hopper also the warp-specialized schedule (kernels.hopper_attention) in both modes
  ("ditgate_plain_hopper", "ditgate_fp8_hopper");
- per budget 1.0 / 0.5 / 0.3 / 0.15 and per pattern (the per-call selector; the static window and radial
  patterns): selection time, then plain (both schedules) / FP8 / compiled flex / fa4's block-sparse path over the
  selection, and at head dim 64 the Hopper schedule over a selection of 192-row query tiles (its three
  warpgroups; rows "..._hopper_192", selected and timed apart), each total = selection
  + kernel, the speed-up over the best exact dense form, the selection overhead as a share of that
  form's time, and the cosine to the exact dense output (float32 reference) on the captured call;
- for the selected pattern, the FP8 sparse form as a plan runs it, selection and kernel timed as one call:
  "fp8_sparse_form" with the selector pooling Q and K itself, "fp8_sparse_pooled" with the form's
  quantization pass summing them for it (``Form.pool_for_selection``; the same lists and output bits); and the
  bf16 sparse form ("block_sparse_form": the selector pools, the kernel with the form's own launch options);
  these rows and the exact dense forms are also timed back to back (``ms_back_to_back``, ``pipelined``);
- the whole path: ``attach(sparse=..., forms=["block_sparse"], measure=False)`` on the same model, the
  forward time against the host and the output cosine.

Random weights give near-uniform attention (no learned locality), so the cosines here are a floor for the
selection's quality, not what trained weights give.

    python benchmarks/sparse_attention.py --out DIR [--models wan-14b-480p-81f ltx-2b-1216x704x257]
        [--patterns selected window radial] [--consumers ROW ...] [--skip-attach]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import ditgate
from ditgate.forms import AttentionInputs, create_forms
from ditgate.forms.base import describe_call
from ditgate.forms.sdpa import SdpaCudnn
from ditgate.gate import compare, environment
from ditgate.gate.timing import warm_samples
from ditgate.hosts import model_output
from ditgate.kernels.quant_attention import KernelConfig, default_config, quant_attention
from ditgate.models.presets import get_preset
from ditgate.sparse.families import layouts_of_forward
from ditgate.sparse.patterns import static_pattern
from ditgate.sparse.selector import TileSelector
from ditgate.kernels.lists import KeyBlockLists

BUDGETS = (1.0, 0.5, 0.3, 0.15)
BLOCK = 128


class CaptureForm(SdpaCudnn):
    """torch SDPA (its own backend choice) that keeps the last self-attention call's inputs."""

    spec = dataclasses.replace(SdpaCudnn.spec, name="capture", devices=frozenset({"cuda", "cpu"}))

    def __init__(self) -> None:
        super().__init__()
        self.captured = None

    def _probe(self):
        from ditgate.forms import Availability

        return Availability(True, "", torch.__version__)

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        if inputs.query.shape[2] == inputs.key.shape[2]:
            self.captured = (inputs.query.clone(), inputs.key.clone(), inputs.value.clone(), inputs.scale)
        return torch.nn.functional.scaled_dot_product_attention(inputs.query, inputs.key, inputs.value,
                                                                 scale=inputs.scale)


DEVICE = torch.device("cuda")


def bench(fn, n=10):
    return statistics.median(warm_samples(fn, DEVICE, n))


def pipelined(fn):
    """Median ms per call of calls issued back to back (``triton.testing.do_bench``: no wait between calls, so
    the host prepares the next call while the GPU runs this one, as in a pipeline). ``bench`` waits for each
    call before the next, so any host work between a call's kernels shows in it: the stricter of the two."""
    if DEVICE.type != "cuda":
        return bench(fn)
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200)


def build(preset_name: str, layers: int, dtype: torch.dtype, overrides: dict, geometry: dict):
    preset = get_preset(preset_name)
    preset = dataclasses.replace(preset, config={**preset.config, "num_layers": layers, **overrides},
                                 geometry={**preset.geometry, **geometry})
    from ditgate.models.presets import _FAMILY_CLASS

    torch.manual_seed(0)
    with DEVICE:
        model = _FAMILY_CLASS[preset.family]()(**preset.config)
    model = model.to(dtype).eval()
    return preset, model, preset.inputs(model, DEVICE, dtype)


def kernel_configs(d: int) -> list[KernelConfig]:
    if DEVICE.type != "cuda":
        return [KernelConfig(BLOCK, BLOCK, 4, 1)]
    return [KernelConfig(128, 128, 8, 3), KernelConfig(128, 128, 4, 3), KernelConfig(128, 128, 8, 2),
            KernelConfig(128, 128, 4, 2), KernelConfig(128, 128, 8, 3, tma=True), KernelConfig(128, 128, 4, 3, tma=True),
            KernelConfig(128, 128, 8, 3, tma=True, warp_specialize=True),
            KernelConfig(128, 128, 4, 3, tma=True, warp_specialize=True)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--models", nargs="+", default=["wan-14b-480p-81f", "ltx-2b-1216x704x257"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run (TRITON_INTERPRET=1, tiny presets)")
    ap.add_argument("--config", default="{}", help="JSON overrides of the model config (dry runs)")
    ap.add_argument("--geometry", default="{}", help="JSON overrides of the preset's latent geometry (dry runs)")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--triton-sweep", action="store_true", help="time the Triton schedule at eight tiles, keep the best")
    ap.add_argument("--consumers", nargs="*", help="time only these sparse rows (names as in the table; default all)")
    ap.add_argument("--patterns", nargs="+", default=["selected", "window", "radial"])
    ap.add_argument("--skip-attach", action="store_true", help="leave out the whole path through attach")
    args = ap.parse_args()
    global DEVICE, BLOCK
    DEVICE, BLOCK = torch.device(args.device), args.block
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float16
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(DEVICE)
    rows: list[dict] = []
    forms = create_forms(["fa4", "sdpa_cudnn", "flex", "fa4_sparse"])

    def save():
        (out / "sparse-attention.json").write_text(json.dumps(
            {"environment": env, "date": time.strftime("%Y-%m-%d"),
             "command": "python benchmarks/sparse_attention.py " + " ".join(sys.argv[1:]), "rows": rows}, indent=2))

    def row(**r):
        rows.append(r)
        print(r, flush=True)

    for name in args.models:
        preset, model, inputs = build(name, args.layers, dtype, json.loads(args.config), json.loads(args.geometry))
        cap = CaptureForm()
        plan = ditgate.attach(model, forms=["capture"], measure=False, extra_forms=[cap])
        with torch.no_grad():
            model(**inputs)
        plan.detach()
        q, k, v, scale = cap.captured
        B, H, S, D = q.shape
        layout = layouts_of_forward(model, (), inputs).for_length(S)
        print(name, tuple(q.shape), layout.source if layout else "no layout", flush=True)
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale,
                                                               enable_gqa=H != k.shape[1])
        dense, back_to_back = {}, {}
        for fname, form in forms.items():
            if fname in ("flex", "fa4_sparse") or not form.availability().available:
                if fname not in ("flex", "fa4_sparse"):
                    row(model=name, row=fname, status=form.availability().reason)
                continue
            x = AttentionInputs(q, k, v, scale=scale)
            dense[fname] = bench(lambda: form.run(x))
            back_to_back[fname] = pipelined(lambda: form.run(x))
            row(model=name, row=fname, pattern="dense", budget=1.0, ms=dense[fname], ms_back_to_back=back_to_back[fname],
                cosine=compare(form.run(x).float(), ref).cosine)
        best_cfg = {}
        for qk in ("plain", "fp8"):
            times = {}
            for cfg in (kernel_configs(D) if args.triton_sweep else [default_config(D, DEVICE.type, qk, BLOCK,
                                                                                    tensors=(q, k, v))]):
                try:
                    times[cfg] = bench(lambda: quant_attention(q, k, v, qk=qk, scale=scale, config=cfg))
                except Exception as exc:
                    row(model=name, row=f"{qk} {cfg}", status=f"{type(exc).__name__}: {exc}"[:200])
            best_cfg[qk] = min(times, key=times.get)
            dense[f"ditgate_{qk}"] = times[best_cfg[qk]]
            row(model=name, row=f"ditgate_{qk}", pattern="dense", budget=1.0, ms=times[best_cfg[qk]],
                config=str(best_cfg[qk]), config_ms={str(c): t for c, t in times.items()},
                cosine=compare(quant_attention(q, k, v, qk=qk, scale=scale, config=best_cfg[qk]).float(), ref).cosine)
        hopper = None
        if DEVICE.type == "cuda" and torch.cuda.get_device_capability()[0] == 9 and BLOCK == 128:
            from ditgate.kernels import hopper_attention as hopper
            for qk in ("plain", "fp8"):
                dense[f"ditgate_{qk}_hopper"] = bench(lambda: hopper.hopper_attention(q, k, v, qk=qk, scale=scale))
                row(model=name, row=f"ditgate_{qk}_hopper", pattern="dense", budget=1.0, ms=dense[f"ditgate_{qk}_hopper"],
                    cosine=compare(hopper.hopper_attention(q, k, v, qk=qk, scale=scale).float(), ref).cosine)
        exact = {n: t for n, t in dense.items() if n in ("fa4", "sdpa_cudnn")} or {"ditgate_plain": dense["ditgate_plain"]}
        best_name = min(exact, key=exact.get)
        best_ms = exact[best_name]
        selector = TileSelector(BLOCK)
        # the Hopper schedule's own query tile with lists (192 rows at head dim 64: three warpgroups)
        tall = hopper.list_rows(D) if hopper is not None and hopper.list_rows(D) != BLOCK else None
        flex = forms["flex"]
        fp8_form = create_forms(["fp8_sparse"])["fp8_sparse"]
        bf16_form = create_forms(["block_sparse"])["block_sparse"]
        call = describe_call(q, k, v, None, 0.0, False, False, torch.cuda.get_device_capability()
                             if DEVICE.type == "cuda" else None)
        form_rows = fp8_form.selection_rows(call, BLOCK) or BLOCK
        bf16_rows = bf16_form.selection_rows(call, BLOCK) or BLOCK
        for pattern in args.patterns:
            for budget in BUDGETS:
                selections = {}  # query rows per tile -> (lists, selection ms)
                for q_rows in (BLOCK, tall) if tall else (BLOCK,):
                    if pattern == "selected":
                        def select(budget=budget, q_rows=q_rows):
                            return selector.select(q, k, layout, budget, q_rows)
                        selections[q_rows] = (select(), bench(select))
                    else:
                        keep = selector.keep_count(layout, budget, q_rows)
                        tiles = static_pattern(pattern, layout, BLOCK, budget, keep, q_rows)
                        # computed once per layout and budget, then reused: no per-call selection
                        selections[q_rows] = (KeyBlockLists.from_tile_mask(tiles.to(DEVICE), B, H, q_rows, BLOCK), 0.0)
                lists, sel_ms = selections[BLOCK]
                if lists is None:  # full budget: the selector says dense
                    row(model=name, row="selector", pattern=pattern, budget=budget, status="dense (budget keeps all)",
                        selection_ms=sel_ms)
                    continue
                kw = dict(kv_index=lists.kv_index, kv_count=lists.kv_count)
                consumers = {
                    "ditgate_plain": (BLOCK, lambda: quant_attention(q, k, v, qk="plain", scale=scale,
                                                                     config=best_cfg["plain"], **kw)),
                    "ditgate_fp8": (BLOCK, lambda: quant_attention(q, k, v, qk="fp8", scale=scale,
                                                                   config=best_cfg["fp8"], **kw)),
                }
                if hopper is not None:
                    for qk in ("plain", "fp8"):
                        consumers[f"ditgate_{qk}_hopper"] = (BLOCK, lambda qk=qk: hopper.hopper_attention(
                            q, k, v, qk=qk, scale=scale, groups=2, **kw))
                        if tall:
                            tl_ = selections[tall][0]
                            consumers[f"ditgate_{qk}_hopper_{tall}"] = (tall, lambda qk=qk, tl_=tl_: hopper.hopper_attention(
                                q, k, v, qk=qk, scale=scale, groups=tall // 64,
                                kv_index=tl_.kv_index, kv_count=tl_.kv_count))
                x = AttentionInputs(q, k, v, attn_mask=lists, scale=scale)
                if flex.availability().available:
                    consumers["flex"] = (BLOCK, lambda: flex.run(x))
                if forms["fa4_sparse"].availability().available:
                    consumers["fa4_sparse"] = (BLOCK, lambda: forms["fa4_sparse"].run(x))
                whole = {}  # selection and kernel timed as one call, through the FP8 sparse form as a plan runs it
                if pattern == "selected" and fp8_form.availability().available:
                    def own_pooling(budget=budget):  # the selector reads Q and K for its tile means
                        sel = selector.select(q, k, layout, budget, form_rows)
                        return fp8_form.run(AttentionInputs(q, k, v, attn_mask=sel, scale=scale))

                    def form_pooling(budget=budget):  # the form's quantization pass sums them (pool_for_selection)
                        made = []

                        def pooled():
                            tiles = fp8_form.pool_for_selection(call, AttentionInputs(q, k, v, scale=scale),
                                                                form_rows, BLOCK)
                            made.append(tiles.prepared)
                            return tiles.query, tiles.key
                        sel = selector.select(q, k, layout, budget, form_rows, pooled)
                        return fp8_form.run(AttentionInputs(q, k, v, attn_mask=sel, scale=scale, prepared=made[0]))
                    whole = {"fp8_sparse_form": own_pooling, "fp8_sparse_pooled": form_pooling}
                    consumers.update({n: (form_rows, fn) for n, fn in whole.items()})
                if pattern == "selected" and bf16_form.availability().available:
                    def bf16_call(budget=budget):  # the selector pools Q and K; the kernel reads the host's tensors
                        sel = selector.select(q, k, layout, budget, bf16_rows)
                        return bf16_form.run(AttentionInputs(q, k, v, attn_mask=sel, scale=scale))
                    whole["block_sparse_form"] = bf16_call
                    consumers["block_sparse_form"] = (bf16_rows, bf16_call)
                if args.consumers:
                    consumers = {n: c for n, c in consumers.items() if n in args.consumers}
                for cname, (q_rows, fn) in consumers.items():
                    tiles_ms = 0.0 if cname in whole else selections[q_rows][1]  # inside the timed call there
                    try:
                        ms = bench(fn)
                        cos = compare(fn().float(), ref).cosine
                    except Exception as exc:
                        row(model=name, row=cname, pattern=pattern, budget=budget,
                            status=f"{type(exc).__name__}: {exc}"[:200])
                        continue
                    total = ms + tiles_ms
                    extra = {}
                    if cname in whole:  # also timed back to back, as a pipeline runs it: the host ahead of the GPU
                        ms_b2b = pipelined(fn)
                        best_b2b = min(back_to_back.values()) if back_to_back else float("nan")
                        extra = dict(ms_back_to_back=ms_b2b, x_best_exact_back_to_back=best_b2b / ms_b2b)
                    row(model=name, row=cname, pattern=pattern, budget=budget, density=selections[q_rows][0].density(S),
                        query_rows=q_rows, ms=ms, selection_ms=tiles_ms, total_ms=total, x_best_exact=best_ms / total,
                        best_exact=best_name, selection_share=tiles_ms / best_ms, cosine=cos, **extra)
        save()
        if args.skip_attach:
            del model, q, k, v, ref, cap
            torch.cuda.empty_cache()
            continue
        # the whole path: attach with a sparse setting, forced onto ditgate's plain kernel
        setting = ditgate.SparseSetting(ditgate.BudgetSchedule(0.3, dense_steps=0, dense_layers=0), block=BLOCK)
        with torch.no_grad():
            host_out = model_output(model(**inputs))
            host_ms = bench(lambda: model(**inputs), n=5)
            plan = ditgate.attach(model, forms=["block_sparse"], measure=False, sparse=setting)
            sparse_out = model_output(model(**inputs))
            sparse_ms = bench(lambda: model(**inputs), n=5)
            served = sum(c.calls for s in plan.report().sites for c in s.routes if c.route == "block_sparse")
            plan.detach()
        row(model=name, row="attach(sparse=0.3, block_sparse)", host_ms=host_ms, ms=sparse_ms,
            x_host=host_ms / sparse_ms, cosine=compare(sparse_out, host_out).cosine, sparse_calls=served)
        save()
        del model, q, k, v, ref, cap
        torch.cuda.empty_cache()
    print(f"{'model':<22}{'row':<16}{'pattern':<10}{'budget':>7}{'dens':>6}{'ms':>9}{'sel ms':>8}{'x best':>8}{'cos':>10}"
          f"{'b2b ms':>9}{'x b2b':>7}")
    for r in rows:
        if "ms" not in r:
            print(f"{r['model']:<22}{r['row']:<16}{r.get('pattern', ''):<10} {r.get('status', '')}")
            continue
        print(f"{r['model']:<22}{r['row'][:15]:<16}{r.get('pattern', ''):<10}{r.get('budget', float('nan')):>7.2f}"
              f"{r.get('density', float('nan')):>6.2f}{r.get('total_ms', r['ms']):>9.3f}"
              f"{r.get('selection_ms', float('nan')):>8.3f}{r.get('x_best_exact', r.get('x_host', float('nan'))):>8.3f}"
              f"{r.get('cosine', float('nan')):>10.6f}{r.get('ms_back_to_back', float('nan')):>9.3f}"
              f"{r.get('x_best_exact_back_to_back', float('nan')):>7.3f}")


if __name__ == "__main__":
    main()
