"""A plan for a compiled model times its linear sites on the device: the host's product and each form's call captured
into CUDA graphs and replayed (``gate.replay``), so that neither side's Python decides a small product's verdict.

On a CPU the CUDA graph is a stand-in that records captures and replays (the capture runs the call, a replay does
nothing): what is checked here is which calls are captured, what each is timed against and the keys they are kept
under. The GPU test at the end captures real graphs."""

import contextlib

import pytest
import torch

import ditgate
from ditgate.gate import linear as linear_gate
from ditgate.gate import replay
from ditgate.gate.linear import LinearSetting
from ditgate.gate.receipt import load_receipt
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

    def keep(self, fn, label, device):
        made(self, fn, label, device)
        clocks.append(self)

    monkeypatch.setattr(ReplayClock, "__init__", keep)
    monkeypatch.setattr(replay, "capture", lambda fn, device: (fn(), FakeGraph(), fn())[1:])
    monkeypatch.setattr(linear_gate, "replay_clocks", lambda device: True)
    return clocks


def _calibrate(tiny: Tiny, device_time: bool = True, **setting):
    plan = ditgate.attach(tiny.model, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False, progress=False,
                          linear=LinearSetting(compiled=True, device_time=device_time, **setting))
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


def test_an_eager_plan_a_plan_not_asking_and_a_plan_without_cuda_graphs_time_as_before(fake_graphs, monkeypatch):
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False, progress=False,
                          linear=LinearSetting(forms=("int8_linear",)))
    tiny.forward()
    plan.detach()
    assert not fake_graphs  # an eager plan's timings are eager calls
    keys = _calibrate(tiny, forms=("int8_linear",), activation_quantization="fused", device_time=False)
    assert keys == {("int8_linear", "compiled: product alone")} and not fake_graphs  # not asked for: eager
    monkeypatch.setattr(linear_gate, "replay_clocks", replay.replay_clocks)  # the real answer: no CUDA here
    keys = _calibrate(tiny, forms=("int8_linear",), activation_quantization="fused", device_time=True)
    assert keys == {("int8_linear", "compiled: product alone")} and not fake_graphs


def _refusing(clocks, label_start: str):
    """A stand-in capture that fails for the clocks whose label starts with ``label_start`` and captures the rest."""
    def capture(fn, device):
        if any(c.fn is fn and c.label.startswith(label_start) for c in clocks):
            raise RuntimeError("operation not permitted when stream is capturing")
        return FakeGraph(), fn()

    return capture


def test_a_call_a_graph_cannot_hold_is_refused_there_with_the_reason(fake_graphs, monkeypatch):
    """No device time, no comparison: the form stays off that key (and a call a CUDA graph cannot hold would not
    survive ``mode="reduce-overhead"`` either); the host's product still captures."""
    monkeypatch.setattr(replay, "capture", _refusing(fake_graphs, "int8_linear"))
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False, progress=False,
                          linear=LinearSetting(forms=("int8_linear",), compiled=True, device_time=True))
    tiny.forward()
    verdicts = [v for v in plan.chooser.verdicts.values() if v.shape_key.startswith("M")]
    plan.detach()
    assert verdicts and all(v.form is None for v in verdicts)
    why = {r.detail for v in verdicts for r in v.refusals if r.form == "int8_linear"}
    assert any("could not be captured in a CUDA graph" in w and "not permitted" in w for w in why), why


def test_a_host_product_a_graph_cannot_hold_turns_device_time_off_for_the_plan_and_says_so(fake_graphs, monkeypatch,
                                                                                          caplog, tmp_path):
    """Where the host's own product cannot be captured no form has a device time to compare with: the site is judged
    again eagerly and so is every later one, under the eager keys, rather than every form refused at every site (an
    H100 run of compiled Flux whose captures all failed left its whole plan on the host, 0.98x stock, unsaid)."""
    monkeypatch.setattr(replay, "capture", _refusing(fake_graphs, "the host's product"))
    tiny = Tiny("tiny-wan")
    with caplog.at_level("WARNING", logger="ditgate.gate"):
        plan = ditgate.attach(tiny.model, profile=LENIENT_SPEED, forms=["sdpa_math"], timing_cache=False,
                              progress=False, linear=LinearSetting(forms=("int8_linear", "fp8_linear"),
                                                                   compiled=True, device_time=True,
                                                                   activation_quantization="fused"))
        tiny.forward()
    keys = {(k.form, k.variant) for k in plan.chooser.book._entries if k.shape_key.startswith("M")}
    verdicts = [v for v in plan.chooser.verdicts.values() if v.shape_key.startswith("M")]
    report, explained = plan.report().linear, plan.explain()
    saved = load_receipt(plan.save(tmp_path / "receipt.json"))
    plan.detach()
    assert "timed eagerly, not on the device, from the site named here on" in " ".join(explained.split())
    assert saved.linear_device_time_off == report.device_time_off  # the receipt says how its verdicts were timed
    assert keys == {(f, "compiled: product alone") for f in ("int8_linear", "fp8_linear")}  # eager keys only
    assert any(v.form == "int8_linear" for v in verdicts)  # the lenient profile's forms win again
    assert not any("could not be captured" in r.detail for v in verdicts for r in v.refusals)
    hosts = [c for c in fake_graphs if c.label.startswith("the host's product")]
    assert len(hosts) == 1  # the first site tried once; no later site tries again
    assert report.device_time_off.startswith(f"{hosts[0].label} could not be captured")
    assert "not permitted" in report.device_time_off
    assert caplog.text.count("timed eagerly, not on the device") == 1  # said once, though each form met the failure
    assert "timed eagerly, not on the device" in caplog.text


def test_a_failed_capture_ends_the_capture_and_reports_the_calls_own_error(monkeypatch):
    """The stand-in graph records the capture's end; the call's error, not the end's, is what propagates."""
    ended = []

    class Graph(FakeGraph):
        def capture_begin(self, **kw):
            pass

        def capture_end(self):
            ended.append(1)
            raise RuntimeError("capture invalidated")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    retired = []
    monkeypatch.setattr(replay, "_CAPTURING", type("C", (), {"of": lambda self, d: (FakeStream(), None),
                                                             "retire": lambda self, d: retired.append(d)})())
    calls = []

    def call():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return torch.ones(2)

    clock = ReplayClock(call, "fp8_linear at blocks.0.ffn.net.2", torch.device("cuda"))
    with pytest.raises(replay.CaptureFailed, match="blocks.0.ffn.net.2 could not be captured.*not permitted"):
        clock()
    assert ended == [1] and clock.graph is None and len(calls) == 2  # the warm call, then the capture's
    assert retired == [torch.device("cuda")]  # its pool, left recording by the failed end, is not captured into again
    with pytest.raises(replay.CaptureFailed, match="not permitted"):
        clock.prime()  # the failure again, with nothing run or captured
    assert len(calls) == 2 and ended == [1]


def test_a_capture_whose_end_fails_retires_its_stream_and_pool_for_the_next(monkeypatch):
    """torch's capture_end raises before it stops routing allocations to the pool; a pool left recording fails every
    later capture into it (the next site's host product's too), so a failed capture takes a new stream and pool."""
    class Graph(FakeGraph):
        def capture_begin(self, **kw):
            begun.append(kw["pool"])

        def capture_end(self):
            if len(begun) == 1:
                raise RuntimeError("operation not permitted when stream is capturing")

    begun: list = []
    pools = iter(range(10))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(pools))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(replay, "_CAPTURING", replay._Capturing())
    cuda = torch.device("cuda")
    with pytest.raises(RuntimeError, match="not permitted"):
        replay.capture(lambda: torch.ones(2), cuda)
    replay.capture(lambda: torch.ones(2), cuda)
    assert begun == [0, 1]  # the second capture went into a pool of its own


class FakeStream:
    def wait_stream(self, other) -> None:
        pass


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_replayed_product_returns_what_the_call_computes_on_a_gpu():
    x = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16)
    clock = ReplayClock(lambda: torch.nn.functional.linear(x, w), "the host's product at test", x.device)
    first = clock().clone()
    assert clock.graph is not None
    x.copy_(torch.randn_like(x))  # a replay reads the captured input's memory again
    assert torch.allclose(clock().float(), torch.nn.functional.linear(x, w).float(), rtol=1e-2, atol=1e-2)
    assert not torch.equal(first, clock())
