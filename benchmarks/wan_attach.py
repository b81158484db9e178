"""Wan 2.1 1.3B configuration (random weights, bf16) at 480p 81 frames = 32760 tokens on one GPU:

A. ``attach(forms=["fa4"], measure=False)``: every self-attention site on flash-attn-4, output cosine to the
   unattached model, detach bit-exactness, host vs attached forward time (interleaved rounds, CUDA events).
B. ``attach(profile="quality")``: calibration on the first forward, the whole-model check, the receipt,
   the explain table, and host vs gated forward time (interleaved, re-attaching from the receipt).

    python benchmarks/wan_attach.py --out DIR [--preset wan-1.3b-480p-81f] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import ditgate
from ditgate.gate import compare, environment
from ditgate.gate.timing import time_once
from ditgate.hosts import model_output
from ditgate.models.presets import get_preset


def interleaved(host_fn, routed_fn, enter, leave, rounds: int, device: torch.device) -> dict:
    def timed(fn) -> float:
        return time_once(fn, device)

    host_ms, routed_ms, ratios = [], [], []
    for r in range(rounds):
        order = ("host", "routed") if r % 2 == 0 else ("routed", "host")
        got = {}
        for which in order:
            if which == "host":
                got["host"] = timed(host_fn)
            else:
                enter()
                try:
                    got["routed"] = timed(routed_fn)
                finally:
                    leave()
        host_ms.append(got["host"])
        routed_ms.append(got["routed"])
        ratios.append(got["host"] / got["routed"])
    return {"host_ms": statistics.median(host_ms), "routed_ms": statistics.median(routed_ms),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "host_samples": host_ms, "routed_samples": routed_ms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="wan-1.3b-480p-81f")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="ditgate-out")
    ap.add_argument("--skip-fa4", action="store_true")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    preset = get_preset(args.preset)
    t0 = time.perf_counter()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = preset.build(device, dtype)
    inputs = preset.inputs(model, device, dtype, seed=0)
    print(f"built {preset.name} in {time.perf_counter() - t0:.1f}s", flush=True)

    def fwd():
        with torch.no_grad():
            return model_output(model(**inputs))

    for _ in range(2):
        fwd()
    host = fwd().float()
    result: dict = {"preset": preset.name, "description": preset.description, "environment": environment(device),
                    "date": time.strftime("%Y-%m-%d"), "command": f"python benchmarks/wan_attach.py --preset {preset.name} --rounds {args.rounds}"}

    if not args.skip_fa4:
        plan = ditgate.attach(model, forms=["fa4"], measure=False)
        routed = fwd().float()
        rep = plan.report()
        plan.detach()
        self_sites = [s for s in rep.sites if s.role == "self"]
        result["fa4_forced"] = {
            "self_sites": len(self_sites),
            "self_sites_on_fa4": sum(s.serving == "fa4" for s in self_sites),
            "cross_sites_on_fa4": sum(s.serving == "fa4" for s in rep.sites if s.role == "cross"),
            "fallbacks": sum(f.failures for s in rep.sites for f in s.failures),
            "cosine_to_unattached": compare(routed, host).cosine,
            "psnr_db": compare(routed, host).psnr_db,
            "detach_bit_exact": bool(torch.equal(fwd().float(), host)),
        }
        holder = {}
        result["fa4_forced"]["timing"] = interleaved(
            fwd, fwd, lambda: holder.__setitem__("p", ditgate.attach(model, forms=["fa4"], measure=False)),
            lambda: holder.pop("p").detach(), args.rounds, device)
        print(json.dumps(result["fa4_forced"], indent=1, default=str), flush=True)

    t0 = time.perf_counter()
    plan = ditgate.attach(model, profile="quality")
    fwd()  # calibrating forward (host serves) + whole-model check
    if device.type == "cuda":
        torch.cuda.synchronize()
    cal_s = time.perf_counter() - t0
    routed = fwd().float()
    rep = plan.report()
    explain = plan.explain()
    receipt_path = plan.save(out / f"receipt-{preset.name}-quality.json")
    receipt = plan.receipt()
    plan.detach()
    serving = {}
    for s in rep.sites:
        serving[s.serving] = serving.get(s.serving, 0) + 1
    holder = {}
    result["quality"] = {
        "calibration_s": cal_s,
        "serving": serving,
        "whole_model": [w.__dict__ for w in rep.whole_model],
        "cosine_to_unattached": compare(routed, host).cosine,
        "receipt": str(receipt_path.name),
        "timing": interleaved(fwd, fwd, lambda: holder.__setitem__("p", ditgate.attach(model, receipt=receipt)),
                              lambda: holder.pop("p").detach(), args.rounds, device),
    }
    (out / f"explain-{preset.name}-quality.txt").write_text(explain)
    (out / f"wan-attach-{preset.name}.json").write_text(json.dumps(result, indent=2, default=str))
    print(explain)
    print(f"{'run':<28}{'host ms':>10}{'routed ms':>11}{'ratio [min-max]':>24}{'cosine':>11}")
    for key in ("fa4_forced", "quality"):
        if key in result:
            t, c = result[key]["timing"], result[key]["cosine_to_unattached"]
            print(f"{key:<28}{t['host_ms']:>10.1f}{t['routed_ms']:>11.1f}"
                  f"{t['ratio']:>10.3f} [{t['ratio_min']:.3f}-{t['ratio_max']:.3f}]{c:>11.6f}")
    if "fa4_forced" in result:
        f = result["fa4_forced"]
        print(f"fa4 forced: {f['self_sites_on_fa4']}/{f['self_sites']} self-attention sites on fa4, "
              f"{f['fallbacks']} fallbacks, detach bit-exact {f['detach_bit_exact']}")
    w = result["quality"]["whole_model"][0] if result["quality"]["whole_model"] else None
    if w:
        print(f"quality whole-model check: {w['ratio']:.3f}x, cosine {w['cosine']:.6f}, {w['note']}; "
              f"serving {result['quality']['serving']}; calibration {cal_s:.1f}s")


if __name__ == "__main__":
    main()
