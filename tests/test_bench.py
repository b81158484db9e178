"""ditgate bench end to end on tiny presets on a CPU: rows, reasons, JSON, PNG, latency gate."""

import json
import subprocess
import sys


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "ditgate.cli.main", "bench", *args], capture_output=True,
                          text=True, timeout=600)


def test_bench_kernels_writes_every_row_and_gates(tmp_path):
    res = _bench("kernels", "--preset", "tiny", "--warm", "3", "--out", str(tmp_path), "--max-ms", "1e6")
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "bench-kernels.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert {"fa4", "sdpa_cudnn", "sdpa_math", "flex", "sage"} <= set(rows)
    assert rows["sdpa_math"]["status"] == "ok" and rows["sdpa_math"]["cosine"] > 0.9999
    assert all(r["status"] == "ok" or r["reason"] for r in data["rows"])
    assert (tmp_path / "bench-kernels.png").stat().st_size > 1000
    assert "latency gate passed" in res.stdout
    slow = _bench("kernels", "--shape", "2,128,32", "--forms", "sdpa_math", "--warm", "2", "--out", str(tmp_path),
                  "--max-ms", "0.000001")
    assert slow.returncode == 1 and "latency gate FAILED" in slow.stdout
    bad = _bench("kernels", "--shape", "2,128")
    assert bad.returncode != 0 and "H,S,D" in bad.stderr


def test_bench_model_rows_reasons_and_gate(tmp_path):
    args = ["model", "--preset", "tiny-wan", "--backends", "native", "_native_cudnn", "sage", "--profiles", "quality",
            "--rounds", "2", "--out", str(tmp_path)]
    res = _bench(*args, "--max-ms", "1e6")
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "bench-model-tiny-wan.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    assert set(rows) == {"stock native", "stock _native_cudnn", "stock sage", "ditgate quality"}
    assert rows["stock native"]["status"] == "ok" and rows["stock native"]["ratio"] == 1.0
    assert rows["ditgate quality"]["status"] == "ok" and rows["ditgate quality"]["cosine"] > 0.9999
    assert rows["ditgate quality"]["cold_ms"] is not None
    assert rows["stock sage"]["status"] != "ok" and "sageattention" in rows["stock sage"]["reason"]
    assert rows["stock _native_cudnn"]["status"] != "ok" and rows["stock _native_cudnn"]["reason"]
    assert data["explain"]["quality"] and data["environment"]["packages"]["diffusers"]
    assert (tmp_path / "bench-model-tiny-wan.png").exists()
    gated = _bench(*args, "--max-ms", "0.000001")
    assert gated.returncode == 1 and "latency gate FAILED" in gated.stdout


def test_stock_rows_do_not_inherit_a_backend():
    """After a stock row, the process default backend is what it was (diffusers' reset alone leaves it set)."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from ditgate.cli.bench_model import _stock_config
    from ditgate.models.presets import get_preset

    model = get_preset("tiny-wan").build()
    before = _AttentionBackendRegistry._active_backend
    cfg = _stock_config(model, "_native_math", 32, False)
    cfg.enter()
    assert _AttentionBackendRegistry._active_backend != before
    cfg.leave()
    assert _AttentionBackendRegistry._active_backend == before
    assert all(getattr(m.processor, "_attention_backend", None) is None
               for m in model.modules() if hasattr(m, "processor"))


def test_bench_model_loads_local_weights(tmp_path):
    from ditgate.models.presets import get_preset

    get_preset("tiny-flux").build(seed=3).save_pretrained(tmp_path / "weights")
    res = _bench("model", "--preset", "tiny-flux", "--weights", str(tmp_path / "weights"), "--backends", "native",
                 "--profiles", "quality", "--rounds", "1", "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "bench-model-tiny-flux.json").read_text())
    assert "--weights" in data["command"] and all(r["status"] == "ok" for r in data["rows"])
