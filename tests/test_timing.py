"""``gate.timing`` on a GPU, with CUDA's events stood in for: a short call's sample starts after one more, untimed call,
so the timed calls queue behind work in flight; a long call is timed alone; in paired rounds the host's call decides
for both sides."""

import torch

from ditgate.gate import timing


class _Event:
    """Records where in the sequence of calls it was recorded; 2 ms apart per call recorded in between."""

    log: list = []

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = len(_Event.log)
        _Event.log.append("event")

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return 2.0 * sum(1 for item in _Event.log[self.at:end.at] if item == "call")


def _timed(monkeypatch, reps, lead):
    _Event.log = []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    ms = timing.time_once(lambda: _Event.log.append("call"), torch.device("cuda"), reps, lead)
    return ms, list(_Event.log)


def test_a_sample_with_a_lead_queues_behind_one_untimed_call(monkeypatch):
    ms, log = _timed(monkeypatch, 3, True)
    assert log == ["call", "event", "call", "call", "call", "event"]
    assert ms == 2.0  # per timed call


def test_a_sample_without_a_lead_times_every_call(monkeypatch):
    ms, log = _timed(monkeypatch, 1, False)
    assert log == ["event", "call", "event"]
    assert ms == 2.0


def test_short_calls_are_sampled_behind_a_lead_and_long_ones_alone(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    cuda = torch.device("cuda")
    short = timing.sampling(lambda: _Event.log.append("call"), cuda, 1.0)  # 2 ms a call in this stand-in
    assert short == timing.Sampling(reps=1, lead=False)  # 2 ms is not below LEAD_BELOW_MS
    monkeypatch.setattr(timing, "LEAD_BELOW_MS", 3.0)
    assert timing.sampling(lambda: _Event.log.append("call"), cuda, 5.0) == timing.Sampling(reps=3, lead=True)


def _paired(monkeypatch, host_short: bool, **kwargs):
    def host():
        pass

    def form():
        pass
    # the form's own first call looks long (its launch latency), the host's as given: the host's decides for both
    monkeypatch.setattr(timing, "sampling", lambda fn, device, target: timing.Sampling(2, fn is host and host_short))
    seen = []
    monkeypatch.setattr(timing, "time_once", lambda fn, device, reps, lead: seen.append((fn, reps, lead)) or 1.0)
    result = timing.paired_timing(host, form, torch.device("cuda"), rounds=2, **kwargs)
    assert result.ratio == 1.0
    return [(fn.__name__, reps, lead) for fn, reps, lead in seen]


def test_paired_rounds_sample_both_sides_as_the_hosts_call_asks(monkeypatch):
    assert _paired(monkeypatch, True) == [("host", 2, True), ("form", 2, True), ("form", 2, True), ("host", 2, True)]
    assert _paired(monkeypatch, False) == [("host", 2, False), ("form", 2, False), ("form", 2, False),
                                           ("host", 2, False)]
    # a caller whose processes must make the same calls (context-parallel ranks) fixes it
    assert all(lead is False for _, _, lead in _paired(monkeypatch, True, lead=False))


def test_on_a_cpu_every_call_is_timed():
    calls = []
    timing.time_once(lambda: calls.append(1), torch.device("cpu"), 3, lead=True)
    assert len(calls) == 3
