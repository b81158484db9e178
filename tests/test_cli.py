"""The command line end to end on a CPU."""

import json
import subprocess
import sys

import pytest


def _ditgate(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ditgate.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_doctor_lists_every_form_with_reasons():
    res = _ditgate("doctor", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    names = {f["name"] for f in data["forms"]}
    assert {"fa4", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math", "flex", "sage"} <= names
    assert all(f["available"] or f["reason"] for f in data["forms"])
    assert {"HunyuanVideoTransformer3DModel", "WanTransformer3DModel"} <= set(data["sparse_layouts"])
    assert data["padding_masks"] == ["HunyuanVideo15Transformer3DModel", "HunyuanVideoFramepackTransformer3DModel",
                                     "HunyuanVideoTransformer3DModel", "MotifVideoTransformer3DModel"]
    table = _ditgate("doctor")
    assert table.returncode == 0 and "sdpa_cudnn" in table.stdout and "forms available here" in table.stdout
    assert "Sparse stage layouts read for" in table.stdout


def test_bench_presets_lists_each_preset_with_its_class():
    res = _ditgate("bench", "presets")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "wan-animate-14b-720p-77f" in text and "WanAnimateTransformer3DModel" in text and "tiny-framepack" in text


def test_bench_calibration_sparse_only_runs_the_sparse_rows_alone(tmp_path):
    """``--sparse-only``: the sparse row is the process's first calibration (no dense row compiles its kernels
    before it); ``--no-compile-ahead`` is accepted beside it."""
    res = _ditgate("bench", "calibration", "--preset", "tiny-wan", "--profiles", "quality", "balanced", "--sparse",
                   "0.3", "--sparse-only", "--no-compile-ahead", "--device", "cpu", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    runs = json.loads((tmp_path / "bench-calibration-tiny-wan.json").read_text())["runs"]
    assert [r["row"] for r in runs] == ["balanced sparse 0.3 (shared)"]  # quality has no sparse row
    assert runs[0]["sites"] > 0 and runs[0]["forwards"] > 0
    res = _ditgate("bench", "calibration", "--preset", "tiny-wan", "--sparse-only", "--device", "cpu",
                   "--out", str(tmp_path / "none"))
    assert res.returncode == 2 and "--sparse-only needs --sparse" in res.stdout and not (tmp_path / "none").exists()


def test_demo_runs_and_writes_reports(tmp_path):
    res = _ditgate("demo", "--models", "tiny-wan", "tiny-flux", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "blocks.0.attn1" in res.stdout and "whole-model check" in res.stdout
    for name in ("tiny-wan", "tiny-flux"):
        data = json.loads((tmp_path / f"demo-{name}.json").read_text())
        assert data["mode"] == "measured" and data["sites"]
        assert all(s["verdicts"] for s in data["sites"])


def test_demo_static_mode_routes_every_site(tmp_path):
    res = _ditgate("demo", "--models", "tiny-ltx", "--static", "--forms", "sdpa_math", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "demo-tiny-ltx.json").read_text())
    assert all(s["serving"] == "sdpa_math" for s in data["sites"])


@pytest.mark.slow  # the gate measures the sparse forms (compiled flex) on top of the dense ones: 10-30 s
def test_demo_with_the_sparse_stage_says_how_each_sparse_form_fared(tmp_path):
    res = _ditgate("demo", "--models", "tiny-wan", "--sparse", "0.5", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "demo-tiny-wan.json").read_text())
    assert data["profile"]["name"] == "speed"  # --sparse needs bounded forms: the speed profile by default
    for site in data["sites"]:
        verdict = site["verdicts"][0]
        texts = {r["form"]: (r["kind"], r["detail"]) for r in verdict["refusals"]}
        measured = {m["form"] for m in verdict["measured"]}
        if site["role"] == "cross":
            assert texts["flex_sparse"] == ("not supported", "sparse: cross-attention stays dense")
        else:  # self-attention: the compiled flex consumer ran on the CPU and was judged, not skipped
            assert "flex_sparse" in measured or texts["flex_sparse"][0] in ("less accurate", "slower")
    refused = _ditgate("demo", "--models", "tiny-wan", "--sparse", "0.5", "--profile", "quality", "--out", str(tmp_path))
    assert refused.returncode == 2 and "bounded" in refused.stderr


def test_bench_model_fuses_the_projections_of_every_row_when_asked(tmp_path):
    """``--fuse-projections``: stock and ditgate rows run diffusers' fused projections, which the linear rows route
    (a model without fuse_qkv_projections is an error before any row)."""
    res = _ditgate("bench", "model", "--preset", "tiny-flux", "--device", "cpu", "--profiles", "speed", "--linear",
                   "--linear-forms", "int8_linear", "--fuse-projections", "--rounds", "1", "--backends", "native",
                   "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    data = json.loads((tmp_path / "bench-model-tiny-flux.json").read_text())
    assert {r["status"] for r in data["rows"]} == {"ok"}
    explained = data["explain"]["speed +linear"]
    assert "attn.to_qkv" in explained and "attn.qkv" in explained
