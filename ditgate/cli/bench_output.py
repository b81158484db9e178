"""What a bench run leaves behind: a terminal table, a JSON file with environment and rows, a PNG plot."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..gate import environment


@dataclass(frozen=True)
class BenchRow:
    group: str  # the shape or model preset the row belongs to
    name: str  # form, backend or profile
    kind: str  # "form" | "stock" | "ditgate"
    status: str  # "ok" | "unavailable" | "unsupported" | "raised" | "out of memory"
    reason: str
    warm_ms: float | None  # median of warm samples
    warm_min_ms: float | None
    warm_max_ms: float | None
    cold_ms: float | None  # the first (compiling / calibrating) pass; never gated
    tflops: float | None
    ratio: float | None  # baseline_ms / warm_ms (> 1 is faster than the baseline)
    cosine: float | None
    psnr_db: float | None
    peak_gib: float | None
    detail: str = ""
    weight_bytes: int | None = None  # bench model: the denoiser's weights resident on the device during the row
    kernels: tuple[tuple[str, float, int], ...] = ()  # --gpu-busy: device ms per kernel name in one pass, longest first

    @classmethod
    def not_run(cls, group: str, name: str, kind: str, status: str, reason: str,
                cold_ms: float | None = None) -> BenchRow:
        """A row that could not be timed, with the reason it says instead of vanishing."""
        return cls(group, name, kind, status, reason, None, None, None, cold_ms, None, None, None, None, None)


def fmt(x: float | None, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def print_table(console: Console, title: str, rows: Sequence[BenchRow]) -> None:
    table = Table(title=title)
    for col in ("group", "row", "status", "warm ms [min-max]", "cold ms", "TFLOP/s", "x baseline", "cosine",
                "PSNR dB", "peak GiB", "weights GiB"):
        table.add_column(col, overflow="fold")
    for r in rows:
        warm = "-" if r.warm_ms is None else f"{r.warm_ms:.3f} [{r.warm_min_ms:.3f}-{r.warm_max_ms:.3f}]"
        status = r.status if r.status == "ok" else escape(f"{r.status}: {r.reason}")
        table.add_row(r.group, r.name, status, warm, fmt(r.cold_ms, ".1f"), fmt(r.tflops, ".0f"),
                      fmt(r.ratio, ".3f"), fmt(r.cosine, ".6f"), fmt(r.psnr_db, ".1f"), fmt(r.peak_gib, ".2f"),
                      fmt(r.weight_bytes / 2**30 if r.weight_bytes is not None else None, ".3f"))
    console.print(table)


def write_json(path: Path, command: str, rows: Sequence[BenchRow], extra: dict | None = None) -> Path:
    payload = {"command": command, "environment": environment(), "rows": [dataclasses.asdict(r) for r in rows]}
    payload.update(extra or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def write_plot(path: Path, title: str, rows: Sequence[BenchRow]) -> Path | None:
    """Horizontal bars of warm ms per row, one panel per group; rows that could not run are labelled."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    groups = list(dict.fromkeys(r.group for r in rows))
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 1.2 + 0.42 * len(rows)), squeeze=False)
    colors = {"form": "#4c72b0", "stock": "#8c8c8c", "ditgate": "#dd8452"}
    for ax, group in zip(axes[:, 0], groups):
        mine = [r for r in rows if r.group == group]
        labels = [r.name for r in mine]
        vals = [r.warm_ms if r.warm_ms is not None else 0.0 for r in mine]
        ax.barh(range(len(mine)), vals, color=[colors.get(r.kind, "#4c72b0") for r in mine])
        ax.set_yticks(range(len(mine)), labels)
        ax.invert_yaxis()
        top = max(vals) if any(vals) else 1.0
        for i, r in enumerate(mine):
            text = (f"{r.warm_ms:.2f} ms" + (f"  {r.ratio:.2f}x" if r.ratio else "")) if r.warm_ms else r.status
            ax.text((r.warm_ms or 0) + top * 0.01, i, text, va="center", fontsize=8)
        ax.set_xlim(0, top * 1.35)
        ax.set_title(group, fontsize=10)
        ax.set_xlabel("warm ms (lower is better)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_gate(console: Console, rows: Sequence[BenchRow], max_ms: float | None, what: str) -> int:
    """Exit status of ``--max-ms``: 1 with the measured figure when the gated warm time is above it."""
    if max_ms is None:
        return 0
    timed = [r for r in rows if r.warm_ms is not None]
    if not timed:
        console.print(f"[red]latency gate: no row could be timed ({what})[/red]")
        return 1
    worst = max(timed, key=lambda r: r.warm_ms)
    if worst.warm_ms > max_ms:
        console.print(f"[red]latency gate FAILED: {worst.group} {worst.name} warm {worst.warm_ms:.3f} ms > "
                      f"{max_ms} ms ({what})[/red]")
        return 1
    console.print(f"latency gate passed: {worst.group} {worst.name} warm {worst.warm_ms:.3f} ms <= {max_ms} ms ({what})")
    return 0
