"""A short table of every result under a folder: what `benchmarks/gpu.sh` prints last.

    python benchmarks/summary.py OUT

Reads, at most two folders down: bench-kernels.json (one line per shape: each form's ms and its ratio to cuDNN),
bench-model-*.json (one line per row: ms, x stock native, cosine, the sites' routes), bench-calibration-*.json
(seconds and stock forwards per calibration, the forms the per-site and shared gates chose), sparse-attention.json (the dense
rows and those at budget 0.3: one call and back to back, x the best exact dense form), fixed-costs.json (block lists
against dense, and the bound), attention-parts.json (per shape, the 8-bit forms whole and their quantization
against cuDNN) and junit*.xml (test counts).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def kernels(data: dict) -> list[str]:
    lines = []
    for group in dict.fromkeys(r["group"] for r in data["rows"]):
        ok = sorted((r for r in data["rows"] if r["group"] == group and r["warm_ms"]), key=lambda r: r["warm_ms"])
        lines.append(f"  {group}: " + ", ".join(f"{r['name']} {r['warm_ms']:.2f} ({r['ratio']:.2f}x)" for r in ok))
    return lines


def model(data: dict) -> list[str]:
    lines = []
    for r in data["rows"]:
        if r["warm_ms"] is None:
            lines.append(f"  {r['name']:<40} {r['status']}: {r['reason'][:80]}")
            continue
        sites = r["detail"].split("sites: ", 1)[1].split(";")[0] if "sites: " in r["detail"] else ""
        lines.append(f"  {r['name']:<40} {r['warm_ms']:8.1f} ms {r['ratio']:6.3f}x  cosine {r['cosine']:.6f}  {sites}")
    return lines


def sparse(data: dict) -> list[str]:
    lines = []
    for r in data["rows"]:
        if r.get("pattern") == "dense" or r.get("budget") == 0.3:
            b2b = (f", back to back {r['ms_back_to_back']:.3f}" if "ms_back_to_back" in r else "") + (
                f" ({r['x_best_exact_back_to_back']:.2f}x)" if "x_best_exact_back_to_back" in r else "")
            x = f" ({r['x_best_exact']:.2f}x {r['best_exact']})" if "x_best_exact" in r else ""
            ms = r.get("total_ms", r["ms"])
            lines.append(f"  {r['model']} {r['pattern']:<8} {r['row']:<26} {ms:7.3f} ms{x}{b2b}, cosine {r['cosine']:.5f}")
    return lines


def lists(data: dict) -> list[str]:
    return [f"  {r['shape']}: {r['blocks']} blocks, {r['ratio']:.4f} of dense (bound {r['bound']:.4f})"
            for r in data["rows"] if "ratio" in r]


def calibration(data: dict) -> list[str]:
    lines = [f"  {r['row']:<36} {r['seconds']:7.1f} s {r['forwards']:6.1f} forwards, {r['timings']} timings, "
             f"{r['cache_hits']} cache hits; attach {r.get('attach_s', 0):.1f} s, contests "
             f"{sum(r.get('contest_s', {}).values()):.1f} s of measuring {r.get('measure_s', 0):.1f} s, probes "
             f"{sum(r.get('probe_s', {}).values()):.1f} s, whole check {r.get('whole_s', 0):.1f} s"
             + (" (replayed)" if r.get("whole_from_cache") else "") for r in data["runs"]]
    for comp in data.get("comparisons", ()):
        same = sum(s["per_site"] == s["shared"] for s in comp["sites"])
        lines.append(f"  {comp['row']}: the same form at {same} of {len(comp['sites'])} (site, shape) pairs")
    return lines


def parts(data: dict) -> list[str]:
    """attention-parts.json: per shape, the exact kernels and fa3_fp8 whole with two launches and with one read."""
    lines = []
    for row in data["rows"]:
        base = row["cudnn"]
        cells = [f"{key} {row[key]:.3f} ({base / row[key]:.2f}x)" for key in
                 ("fa3", "form_fa3_fp8", "form_fa3_fp8_at_site", "form_fp8", "form_int8") if key in row]
        quant = [f"{key} {row[key]:.3f}" for key in ("heads_8192w2", "heads_carried") if key in row]
        lines.append(f"  {row['shape']}: cudnn {base:.3f}; " + ", ".join(cells) + "; quantization " + ", ".join(quant))
    return lines


def tests(path: Path) -> list[str]:
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return ["  " + ", ".join(f"{v} {k}" for k, v in counts.items()) + f" in {float(suite.get('time', 0)):.0f} s"]


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "ditgate-out")
    files = sorted(p for pattern in ("*", "*/*", "*/*/*") for p in out.glob(pattern) if p.is_file())
    for path in files:
        try:
            if path.name.startswith("junit") and path.suffix == ".xml":
                lines = tests(path)
            elif path.name == "bench-kernels.json":
                lines = kernels(json.loads(path.read_text()))
            elif path.name.startswith("bench-model-") and path.suffix == ".json":
                lines = model(json.loads(path.read_text()))
            elif path.name.startswith("bench-calibration-") and path.suffix == ".json":
                lines = calibration(json.loads(path.read_text()))
            elif path.name == "fixed-costs.json":
                lines = lists(json.loads(path.read_text()))
            elif path.name == "sparse-attention.json":
                lines = sparse(json.loads(path.read_text()))
            elif path.name == "attention-parts.json":
                lines = parts(json.loads(path.read_text()))
            else:
                continue
        except (ValueError, KeyError, TypeError, ET.ParseError) as exc:  # a run cut short leaves partial files
            lines = [f"  unreadable: {type(exc).__name__}: {exc}"]
        print(f"{path.relative_to(out)}")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
