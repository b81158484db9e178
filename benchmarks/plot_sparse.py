"""Speed-up over the best exact dense form against budget, and cosine, from sparse_attention.py's JSON.

    python benchmarks/plot_sparse.py OUT/sparse-attention.json   (writes the PNG beside it)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    path = Path(sys.argv[1])
    rows = [r for r in json.loads(path.read_text())["rows"] if "x_best_exact" in r]
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models) + 3, 7), squeeze=False)
    styles = {"selected": "-", "window": "--", "radial": ":"}
    colours = {"ditgate_plain": "C0", "ditgate_plain_hopper": "C4", "ditgate_fp8": "C3", "ditgate_fp8_hopper": "C5",
               "ditgate_plain_hopper_192": "C9", "ditgate_fp8_hopper_192": "C6",
               "flex": "C2", "fa4_sparse": "C1", "fp8_sparse_form": "C7", "fp8_sparse_pooled": "C8"}
    for col, model in enumerate(models):
        for (consumer, pattern) in sorted({(r["row"], r["pattern"]) for r in rows if r["model"] == model}):
            pts = sorted((r["budget"], r["x_best_exact"], r["cosine"]) for r in rows
                         if r["model"] == model and r["row"] == consumer and r["pattern"] == pattern)
            b, x, c = zip(*pts)
            kw = dict(color=colours.get(consumer, "k"), linestyle=styles.get(pattern, "-"), marker="o",
                      label=f"{consumer} / {pattern}")
            axes[0][col].plot(b, x, **kw)
            axes[1][col].plot(b, c, **kw)
            b2b = sorted((r["budget"], r["x_best_exact_back_to_back"]) for r in rows if r["model"] == model
                         and r["row"] == consumer and r["pattern"] == pattern and "x_best_exact_back_to_back" in r)
            if b2b:  # the whole calls also timed back to back, as a pipeline issues them
                axes[0][col].plot(*zip(*b2b), **{**kw, "marker": "^", "linestyle": "-.",
                                                 "label": f"{consumer} / {pattern}, back to back"})
        best = next(r["best_exact"] for r in rows if r["model"] == model)
        axes[0][col].axhline(1.0, color="grey", linewidth=0.8)
        for target in (2.8, 4.0):  # the sparse stage's targets at budget 0.3: bf16 and FP8
            axes[0][col].axhline(target, color="grey", linewidth=0.6, linestyle=":")
        axes[0][col].set_title(f"{model}: speed-up over {best} (selection included)")
        axes[0][col].set_ylabel("x best exact dense")
        axes[1][col].set_ylabel("cosine to dense (random weights)")
        for ax in axes[:, col]:
            ax.set_xlabel("budget (share of video key tiles kept)")
            ax.invert_xaxis()
            ax.grid(alpha=0.3)
    seen = {}  # every model's series in one legend (the models' consumers differ: 192-row lists at head dim 64)
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    axes[0][-1].legend(list(seen.values()), list(seen), fontsize=6, loc="upper left",
                       bbox_to_anchor=(1.02, 1.0))  # beside the plots, not over them
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
