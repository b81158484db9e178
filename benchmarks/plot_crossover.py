"""Each candidate's speed over the host against sequence length, from sparse_crossover.py's JSON files.

    python benchmarks/plot_crossover.py OUT.png FILE.json [FILE.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    out, files = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    fig, axes = plt.subplots(1, len(files), figsize=(6 * len(files), 4.2), squeeze=False)
    for ax, path in zip(axes[0], files):
        rows = json.loads(path.read_text())["rows"]
        forms = sorted({f for r in rows for f in r["candidates"]})
        for form in forms:
            pts = [(r["tokens"], r["candidates"][form]["ratio"]) for r in rows if form in r["candidates"]]
            ax.plot(*zip(*pts), marker="o", label=form)
        for r in rows:  # the gate's choice, written over each length
            ax.annotate(r["chosen"], (r["tokens"], 0.05), rotation=90, fontsize=7, xycoords=("data", "axes fraction"))
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("x host (selection included)")
        floor = "per-call cosine floor lowered (speed decides)" if "floor" in path.stem else "speed profile"
        ax.set_title(f"{rows[0]['model']}: {floor}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
