"""``ditgate demo``: the main job on built-in tiny models, end to end.

For each preset: build the real diffusers class with random weights, run the host forward, attach,
run the calibrating forward and a routed forward, compare with the host, print the plan, write the JSON
report, detach and check that the model is bit-exactly what it was.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from .. import attach
from ..gate import compare
from ..hosts import model_output
from ..models.presets import get_preset


def demo(models: list[str], profile: str = "quality", forms: list[str] | None = None, static: bool = False,
         device: str | None = None, out: str = "ditgate-out", sparse=None) -> int:
    """``sparse``: a ``SparseSetting``; its block-sparse forms join the candidates (bounded error, so the
    profile must allow bounded forms) and each site's verdict says how they fared or why they stayed out."""
    console = Console(width=max(Console().width, 140))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = []
    failed = False
    for name in models:
        preset = get_preset(name)
        t0 = time.perf_counter()
        with console.status(f"{name}: building {preset.description}"):
            model = preset.build(device, dtype)
            inputs = preset.inputs(model, device, dtype)
            with torch.no_grad():
                host = model_output(model(**inputs)).clone()
        with console.status(f"{name}: attaching and calibrating"):
            plan = attach(model, profile=profile, forms=forms, measure=not static, sparse=sparse)
            with torch.no_grad():
                first = model_output(model(**inputs))
                routed = model_output(model(**inputs))
        acc = compare(routed, host)
        print(f"\n{name}: {preset.description}")
        print(plan.explain(), flush=True)
        report_path = plan.report().save(out_dir / f"demo-{name}.json")
        plan.detach()
        with torch.no_grad():
            after = model_output(model(**inputs))
        exact_first = torch.equal(first, host) if not static else None
        exact_detach = torch.equal(after, host)
        failed |= not exact_detach or (exact_first is False)
        summary.append((name, plan.report().sites, acc, exact_first, exact_detach, report_path,
                        time.perf_counter() - t0))
    table = Table(title=f"ditgate demo on {device} ({str(dtype).removeprefix('torch.')})")
    for col in ("model", "sites", "served by a form", "routed vs host cosine", "calibration = host",
                "detach bit-exact", "report", "s"):
        table.add_column(col)
    for name, sites, acc, exact_first, exact_detach, path, secs in summary:
        served = sum(1 for s in sites if s.serving not in ("host", "-"))
        table.add_row(name, str(len(sites)), str(served), f"{acc.cosine:.6f}",
                      "-" if exact_first is None else ("yes" if exact_first else "NO"),
                      "yes" if exact_detach else "NO", str(path), f"{secs:.1f}")
    console.print(table)
    console.print(f"JSON reports written to {out_dir.resolve()}")
    return 1 if failed else 0
