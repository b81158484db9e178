"""Test helpers: tiny real diffusers models, forward runners, and fake forms whose behaviour a test picks."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ditgate.forms import AttentionInputs, Availability, Form, FormSpec, MaskKind, Precision
from ditgate.gate import PROFILES
from ditgate.hosts import model_output
from ditgate.models.presets import ModelPreset, get_preset

# The speed profile with its floors out of the way: on a CPU the timings decide nothing, so every form that passes
# accuracy wins its site (tests of what a routed site does, not of which form is fastest).
LENIENT_SPEED = dataclasses.replace(PROFILES["speed"], min_speedup=1e-6, min_whole_ratio=1e-6, rounds=2,
                                    screen_margin=None)

# The start of a child script of ``compiled_child``: a stand-in Triton driver that compiles launches for sm_90 and
# runs none, and ``compiles``, what Triton's compile listener reports.
HOPPER = textwrap.dedent("""
    import json, threading
    import torch
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class Hopper:
        '''Enough of Triton's CUDA driver to specialize and compile launches for sm_90, none to run them.'''
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)
        def get_current_device(self):
            return 0
        def get_current_stream(self, device=None):
            return 0

    driver.set_active(Hopper())
    compiles = []
    knobs.compilation.listener = lambda **kw: compiles.append(
        {"thread": threading.current_thread().name, "hit": kw["cache_hit"], "kernel": kw["src"].fn.__name__})
""")


def compiled_child(tmp_path: Path, script: str, name: str = "child.py", timeout: int = 600) -> dict:
    """``script`` run in a child process without ``TRITON_INTERPRET`` (which conftest sets, and under which Triton's
    kernels are not JIT functions and never compile), with a fresh Triton cache in ``tmp_path``: the JSON of its last
    line of output. The script is a file, as Triton reads a kernel's source from its file."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    path = tmp_path / name
    path.write_text(script)
    run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


TINY = ("tiny-ltx", "tiny-wan", "tiny-flux", "tiny-cogvideox", "tiny-pixart", "tiny-hunyuan-video",
        "tiny-hunyuan-video15", "tiny-mochi", "tiny-ltx2", "tiny-cosmos", "tiny-chronoedit", "tiny-wan-animate",
        "tiny-framepack", "tiny-consisid", "tiny-easyanimate", "tiny-allegro",
        "tiny-kandinsky5", "tiny-helios", "tiny-motif-video", "tiny-kandinsky6")


class Tiny:
    """A preset (by name, or a ``ModelPreset`` itself) built with its inputs."""

    def __init__(self, name: str | ModelPreset, seed: int = 0) -> None:
        self.preset = name if isinstance(name, ModelPreset) else get_preset(name)
        self.model = self.preset.build(seed=seed)
        self.inputs = self.preset.inputs(self.model, seed=seed)

    def forward(self, **overrides) -> torch.Tensor:
        with torch.no_grad():
            return model_output(self.model(**{**self.inputs, **overrides})).clone()


def twice(inputs: dict) -> dict:
    """The same inputs as a batch of two: every batched tensor repeated (frame indices are not batched)."""
    return {k: (v.expand(2, *v.shape[1:]) if isinstance(v, torch.Tensor) and v.dim() > 1 and not k.startswith("indices")
                else v) for k, v in inputs.items()}


def sdpa(inputs: AttentionInputs) -> torch.Tensor:
    return F.scaled_dot_product_attention(inputs.query, inputs.key, inputs.value, attn_mask=inputs.attn_mask,
                                          is_causal=inputs.is_causal, scale=inputs.scale,
                                          enable_gqa=inputs.enable_gqa)


class FakeForm(Form):
    """A form whose behaviour a test chooses: exact SDPA, slowed, perturbed or raising."""

    def __init__(self, name: str, precision: Precision = Precision.EXACT, delay_s: float = 0.0,
                 noise: float = 0.0, raises: bool = False, masks=frozenset({MaskKind.NONE, MaskKind.ADDITIVE}),
                 scale: float = 1.0):
        super().__init__()
        self.spec = FormSpec(name=name, precision=precision, description=f"test form {name}",
                             devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}), mask_kinds=masks)
        self.delay_s, self.noise, self.raises, self.scale = delay_s, noise, raises, scale
        self.calls = 0

    def _probe(self) -> Availability:
        return Availability(True, "", "test")

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        self.calls += 1
        if self.raises:
            raise RuntimeError(f"{self.name} exploded on purpose")
        if self.delay_s:
            time.sleep(self.delay_s)
        out = sdpa(inputs) * self.scale if self.scale != 1.0 else sdpa(inputs)
        if self.noise:
            gen = torch.Generator().manual_seed(self.calls)
            out = out + self.noise * out.std() * torch.randn(out.shape, generator=gen)
        return out


class CaptureForm(FakeForm):
    """Exact SDPA that records every call's query (B, H, S, D) in call order."""

    def __init__(self, name: str = "capture") -> None:
        super().__init__(name)
        self.spec = FormSpec(name=name, precision=Precision.EXACT, description="records queries",
                             devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}),
                             mask_kinds=frozenset({MaskKind.NONE, MaskKind.BOOLEAN, MaskKind.ADDITIVE}))
        self.queries: list[torch.Tensor] = []

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        self.queries.append(inputs.query.clone())
        return sdpa(inputs)


def routes_of(plan) -> dict[str, dict[tuple[str, str], int]]:
    """Per site: calls per (route, reason), from the plan's report."""
    return {s.name: {(c.route, c.reason): c.calls for c in s.routes} for s in plan.report().sites}


class ListsForm(FakeForm):
    """A block-sparse consumer (key-block lists only): SDPA over the token mask its lists mean, in a graph too."""

    def __init__(self, name: str = "lists") -> None:
        super().__init__(name, Precision.BOUNDED, masks=frozenset({MaskKind.BLOCK}))

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        return self.in_graph(inputs)

    def in_graph(self, inputs: AttentionInputs) -> torch.Tensor:
        mask = inputs.attn_mask.token_mask(inputs.query.shape[2], inputs.key.shape[2])
        return F.scaled_dot_product_attention(inputs.query, inputs.key, inputs.value, attn_mask=mask,
                                              scale=inputs.scale)
