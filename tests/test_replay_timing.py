"""A plan for a compiled model times its linear sites on the device: the host's product and each form's call captured
into CUDA graphs and replayed (``gate.replay``), so that neither side's Python decides a small product's verdict.

On a CPU the CUDA graph is a stand-in that records captures and replays (the capture runs the call, a replay does
nothing): what is checked here is which calls are captured, what each is timed against and the keys they are kept
under. The GPU test at the end captures real graphs."""

import logging

import pytest
import torch

import ditgate
from ditgate.gate import linear as linear_gate
from ditgate.gate import replay
from ditgate.gate.linear import LinearSetting
from ditgate.gate.replay import DEVICE_TIME, ReplayClock

from .helpers import LENIENT_SPEED, Tiny


class FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


@pytest.fixture
def fake_graphs(monkeypatch):
    """CUDA graphs on a CPU: capturing runs the call, replaying counts. Every clock made is kept, with its label."""
    clocks = []
    made = ReplayClock.__init__

    def keep(self, fn, label):
        made(self, fn, label)
        clocks.append(self)

    monkeypatch.setattr(ReplayClock, "__init__", keep)
    monkeypatch.setattr(replay, "capture", lambda fn: (FakeGraph(), fn()))
    monkeypatch.setattr(linear_gate, "replay_clocks", lambda device: True)
    return clocks


def _calibrate(tiny: Tiny, **setting):
    plan = ditgate.attach(tiny.model, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False, progress=False,
                          linear=LinearSetting(compiled=True, **setting))
    tiny.forward()
    keys = {(k.form, k.variant) for k in plan.chooser.book._entries if k.shape_key.startswith("M")}
    plan.detach()
    return keys


def test_a_plan_for_a_compiled_model_times_each_form_against_the_hosts_product_replayed(fake_graphs):
    keys = _calibrate(Tiny("tiny-wan"), forms=("int8_linear",), activation_quantization="apart")
    # the product alone where the graph fuses the input's quantization, the call whole at the down projections
    assert keys == {("int8_linear", f"compiled: product alone, {DEVICE_TIME}"),
                    ("int8_linear", f"compiled: whole, {DEVICE_TIME}")}
    hosts = [c for c in fake_graphs if c.label.startswith("the host's product")]
    forms = [c for c in fake_graphs if c.label.startswith("int8_linear")]
    captured_hosts = [c for c in hosts if c.graph is not None]
    captured_forms = [c for c in forms if c.graph is not None]
    # captured only where the contest timed (a site whose key was timed already runs no clock) ...
    assert captured_forms and len(captured_forms) < len(forms)
    # ... and every timed form was timed against the host's product replayed, not against the host's eager call
    assert len(captured_hosts) == len(captured_forms)
    assert all(c.graph.replays >= LENIENT_SPEED.rounds for c in captured_hosts + captured_forms)
    assert not any(c.eager for c in fake_graphs)


def test_an_eager_plan_and_a_plan_without_cuda_graphs_time_as_before(fake_graphs, monkeypatch):
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False, progress=False,
                          linear=LinearSetting(forms=("int8_linear",)))
    tiny.forward()
    plan.detach()
    assert not fake_graphs  # an eager plan's timings are eager calls
    monkeypatch.setattr(linear_gate, "replay_clocks", replay.replay_clocks)  # the real answer: no CUDA here
    keys = _calibrate(tiny, forms=("int8_linear",), activation_quantization="fused")
    assert keys == {("int8_linear", "compiled: product alone")} and not fake_graphs


def test_a_call_a_graph_cannot_hold_is_timed_eagerly_and_said_so(monkeypatch, caplog):
    def refuses(fn):
        fn()
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(replay, "capture", refuses)
    calls = []
    clock = ReplayClock(lambda: calls.append(1) or torch.ones(2), "fp8_linear at blocks.0.ffn.net.2")
    with caplog.at_level(logging.INFO, logger="ditgate"):
        out = clock()
        clock()
    assert clock.eager and clock.graph is None and torch.equal(out, torch.ones(2))
    assert len(calls) == 4  # the warm call, the failed capture, then every call itself
    assert "fp8_linear at blocks.0.ffn.net.2 could not be captured" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_replayed_product_returns_what_the_call_computes_on_a_gpu():
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    clock = ReplayClock(lambda: torch.nn.functional.linear(x, w), "the host's product at test")
    first = clock().clone()
    assert clock.graph is not None and not clock.eager
    x.copy_(torch.randn_like(x))  # a replay reads the captured input's memory again
    assert torch.equal(clock(), torch.nn.functional.linear(x, w))
    assert not torch.equal(first, clock())
