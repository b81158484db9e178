"""Issue 4's table as a picture, from hopper_kernel.py's JSON (or pin_ab.py's, run with ``--variants default``):
per shape, the dense forms' speed-up over cuDNN (bars, cosine to the exact output written on each), with the
issue's targets drawn as lines (the FP8 form at 1.5x cuDNN and at 1.3x flash-attn-4); and the block lists'
time as a fraction of their own dense time against density, with the bound 1.15 x density.

    python benchmarks/plot_hopper_kernel.py benchmarks/results/2026-12-03-h200-s9/f-table/hopper-kernel.json [OUT.png]
    python benchmarks/plot_hopper_kernel.py benchmarks/results/2026-12-03-h200-s10/e-final/pin-ab.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {"cudnn": "C7", "fa4": "C1", "plain": "C0", "fp8": "C3", "int8": "C2"}


def _family(row: str) -> str:
    """'sdpa_cudnn' -> cudnn, 'hopper fp8 s4 p3 g3' -> fp8."""
    if row == "sdpa_cudnn":
        return "cudnn"
    return row.split()[1] if row.startswith("hopper ") else row


def _from_pin_ab(data: dict) -> dict:
    """pin_ab.py's rows (one per round and variant) as hopper_kernel.py's: each dense form's time the mean of
    its rounds with round 0's cosine, each list's time as a fraction of its mode's dense time."""
    rows = []
    dense: dict[tuple[str, str], list[dict]] = {}
    for r in data["rows"]:
        if r["form"] in ("cudnn", "fa4"):
            rows.append(dict(shape=r["shape"], row="sdpa_cudnn" if r["form"] == "cudnn" else "fa4", ms=r["ms"],
                             cosine=math.nan))
        elif "blocks" not in r:
            dense.setdefault((r["shape"], r["form"].split("-")[1]), []).append(r)
    for (shape, qk), runs in dense.items():
        rows.append(dict(shape=shape, row=f"hopper {qk}", ms=sum(r["ms"] for r in runs) / len(runs),
                         cosine=next(r["cosine"] for r in runs if r.get("cosine") is not None)))
    own = {(r["shape"], r["row"].split()[1]): r["ms"] for r in rows if r["row"].startswith("hopper ")}
    for r in data["rows"]:
        if "blocks" in r:
            qk = r["form"].split("-")[1]
            rows.append(dict(shape=r["shape"], row=f"hopper {qk} lists", ms=r["ms"], density=r["blocks"] / r["of"],
                             x_own_dense_time=r["ms"] / own[(r["shape"], qk)]))
    return dict(environment=dict(gpu=data.get("gpu", "")), date=data.get("date", ""), command=data.get("command", ""),
                rows=rows)


def main() -> None:
    path = Path(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else path.with_suffix(".png")
    data = json.loads(path.read_text())
    if data["rows"] and "form" in data["rows"][0]:
        data = _from_pin_ab(data)
    rows = data["rows"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(2, len(shapes), figsize=(6.5 * len(shapes), 8.5), squeeze=False)
    for col, shape in enumerate(shapes):
        here = [r for r in rows if r["shape"] == shape]
        cudnn = next(r["ms"] for r in here if r["row"] == "sdpa_cudnn")
        fa4 = next((r["ms"] for r in here if r["row"] == "fa4"), None)
        dense = [r for r in here if "density" not in r and not r["row"].startswith("quantize")
                 and not math.isnan(r.get("cosine", math.nan))]
        ax = axes[0][col]
        names = [_family(r["row"]) for r in dense]
        speed = [cudnn / r["ms"] for r in dense]
        bars = ax.bar(names, speed, color=[COLOURS.get(n, "k") for n in names])
        for bar, r in zip(bars, dense):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{r['ms']:.2f} ms\ncos {r['cosine']:.5f}",
                    ha="center", va="bottom", fontsize=8)
        ax.axhline(1.5, color="C3", linestyle="--", linewidth=1, label="target: FP8 1.5x cuDNN")
        if fa4 is not None:
            ax.axhline(1.3 * cudnn / fa4, color="C1", linestyle="--", linewidth=1, label="target: FP8 1.3x fa4")
        ax.set_ylim(0, max(speed + [1.5]) * 1.25)
        ax.set_ylabel("speed-up over cuDNN SDPA")
        ax.set_title(f"{shape}: dense, bf16 in and out")
        ax.legend(loc="upper left", fontsize=8)
        ax = axes[1][col]
        if not any("density" in r for r in here):
            ax.set_visible(False)
            continue
        for family in ("plain", "fp8", "int8"):
            pts = sorted((r["density"], r["x_own_dense_time"]) for r in here
                         if "density" in r and _family(r["row"]) == family)
            if pts:
                d, x = zip(*pts)
                ax.plot(d, x, marker="o", color=COLOURS[family], label=family)
        d = [0.125, 0.25, 0.5]
        ax.plot(d, [1.15 * x for x in d], color="grey", linestyle="--", label="bound 1.15 x density")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("density (key blocks listed / all)")
        ax.set_ylabel("time / own dense time")
        ax.set_title(f"{shape}: block lists")
        ax.legend(fontsize=8)
    fig.suptitle(f"{data.get('environment', {}).get('gpu', '')}, {data.get('date', '')}: {data.get('command', '')}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
