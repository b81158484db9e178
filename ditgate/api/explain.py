"""``Plan.explain()``: the report as a table a person reads (rich, rendered to plain text)."""

from __future__ import annotations

import io
import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..gate.verdict import NOT_ALLOWED, UNAVAILABLE
from .report import LinearRecord, PlanReport


def _bytes(n: int) -> str:
    if n == 0:
        return "0"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _verdict_cells(site) -> tuple[str, str, str, str, str]:
    """A site's verdicts in five cells (attention and linear sites alike)."""
    if not site.verdicts:
        return "-", "-", "-", "-", ""
    parts = {"verdict": [], "ratio": [], "cos": [], "mem": [], "why": []}
    for v in site.verdicts:
        c = v.chosen if v.form else None
        parts["verdict"].append(f"{v.form or 'host'} ({v.source})")
        parts["ratio"].append(f"{c.ratio:.2f}x [{c.ratio_min:.2f}-{c.ratio_max:.2f}]\n{c.timing_text(v.site)}" if c else "-")
        parts["cos"].append(f"{c.cosine:.6f}" if c else "-")
        parts["mem"].append(f"+{_bytes(c.peak_bytes)} peak / {_bytes(c.resident_bytes)} held" if c else "-")
        # Refusals that hold for every site (form not available here, not allowed by the profile) are
        # listed once under the table; the cell keeps what is particular to this site and shape.
        local = [r.text() for r in v.refusals if r.kind not in (UNAVAILABLE, NOT_ALLOWED)]
        parts["why"].append("; ".join(local) or v.note)
    return tuple("\n".join(parts[k]) for k in ("verdict", "ratio", "cos", "mem", "why"))


def _linear_table(linear: LinearRecord, measured: bool) -> Table:
    title = (f"linear sites: {_bytes(linear.bytes_before)} -> {_bytes(linear.bytes_now)} on the device "
             f"(host weights of quantized sites kept on the {linear.keep_host})")
    captions = (["timed eagerly, not on the device, from the site named here on: " + linear.device_time_off]
                if linear.device_time_off else [])
    if linear.left_alone:
        captions.append(f"{len(linear.left_alone)} linear module(s) left to the host, first "
                        f"{linear.left_alone[0][0]}: {linear.left_alone[0][1]}")
    table = Table(title=title, show_lines=measured, expand=False,
                  caption=escape("\n".join(captions)) if captions else None)
    for col in ("site", "role", "shape(s)", "serving", "calls", "fallbacks", "weights", "bytes before -> now"):
        table.add_column(col, overflow="fold")
    if measured:
        for col in ("verdict", "ratio [min-max]", "cosine", "memory", "reasons"):
            table.add_column(col, overflow="fold")
    for s in linear.sites:
        # a plan that measures says why in its verdict columns; a static one says it beside the route
        hosted = "" if measured else "; ".join(f"host {c.calls}: {c.reason}" for c in s.routes
                                               if c.route == "host" and c.reason)
        if s.aside:
            hosted = (hosted + "; " if hosted else "") + "own forward again (calls since not counted)"
        row = [s.name, s.role, "\n".join(s.shapes) or "(not called)", s.serving + (f"\n{hosted}" if hosted else ""),
               str(s.calls), str(sum(f.failures for f in s.failures)),
               s.weights + (f"\n{s.clamped_calls} call(s) clamped" if s.clamped_calls else ""),
               f"{_bytes(s.bytes_before)} -> {_bytes(s.bytes_now)}"]
        if measured:
            row += list(_verdict_cells(s))
        table.add_row(*row)
    return table


def explain(report: PlanReport, width: int = 220) -> str:
    title = f"ditgate plan ({report.mode}" + (f", profile {report.profile['name']}" if report.profile else "") + ")"
    table = Table(title=title, show_lines=bool(report.profile), expand=False)
    compiled = any(s.compiled for s in report.sites)
    for col in ("site", "role", "shape(s)", "serving", "calls", "fallbacks") + (("compiled",) if compiled else ()):
        table.add_column(col, overflow="fold")
    if report.profile:
        for col in ("verdict", "ratio [min-max]", "cosine", "memory", "reasons"):
            table.add_column(col, overflow="fold")
    for s in report.sites:
        row = [s.name, s.role, "\n".join(s.shapes) or "(not called)", s.serving, str(s.calls),
               str(sum(f.failures for f in s.failures))]
        if compiled:
            row.append("\n".join(f"{c.route}" + (f" ({c.reason})" if c.reason else "") + f": {c.calls} trace(s)"
                                 for c in s.compiled) or "-")
        if report.profile:
            row += list(_verdict_cells(s))
        table.add_row(*row)
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    console.print(table)
    if report.linear is not None:
        console.print(_linear_table(report.linear, bool(report.profile)))
    lines = []
    if compiled:
        lines.append("compiled: the routes torch.compile traced into graphs, per trace; calls served inside compiled "
                     "graphs run no ditgate code and are not counted under calls")
    for w in report.whole_model:
        lines.append(
            f"whole-model check {w.model or '(model)'}: "
            + ("speed not timed, " if math.isnan(w.ratio) else f"host {w.host_ms:.1f} ms, routed {w.routed_ms:.1f} ms, "
               f"{w.ratio:.3f}x [{w.ratio_min:.3f}-{w.ratio_max:.3f}], ")
            + f"output cosine {w.cosine:.6f}, "
            f"PSNR {w.psnr_db:.1f} dB, {'passed' if w.passed else 'FAILED'} after {w.attempts} attempt(s): {w.note}"
            + (f"; reverted {len(w.reverted)} route(s)" if w.reverted else "")
        )
    if report.sparse is not None:
        for name, text in report.sparse.layouts:
            lines.append(f"sparse stage ({report.sparse.setting}), layout of {name or 'the model'}: {text}")
    for sk in report.skipped:
        lines.append(f"not intercepted: {sk.path}: {sk.reason}")
    if report.repaired_heads:
        lines.append("re-quantized where the statistics carried from a site's previous call did not hold: "
                     + ", ".join(f"{name} {n} head(s)" for name, n in report.repaired_heads))
    if report.profile:
        allowed = set(report.order)
        lines.append(f"candidates ({report.profile['name']}): {', '.join(report.order) or 'none'}; not allowed: "
                     + (", ".join(f.name for f in report.forms if f.name not in allowed) or "none"))
    unavailable = [f for f in report.forms if not f.available]
    if unavailable:
        lines.append("unavailable forms: " + "; ".join(f"{f.name} ({f.reason})" for f in unavailable))
    return console.export_text() + ("\n".join(lines) + "\n" if lines else "")
