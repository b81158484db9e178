"""``gate.timing.time_once`` on a GPU, with CUDA's events stood in for: where a sample holds several calls, one more
call goes first, untimed, so the timed calls queue behind work in flight; a call that makes a sample alone is timed
alone."""

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


def _timed(monkeypatch, reps):
    _Event.log = []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    ms = timing.time_once(lambda: _Event.log.append("call"), torch.device("cuda"), reps)
    return ms, list(_Event.log)


def test_several_calls_per_sample_queue_behind_one_untimed_call(monkeypatch):
    ms, log = _timed(monkeypatch, 3)
    assert log == ["call", "event", "call", "call", "call", "event"]
    assert ms == 2.0  # per timed call


def test_a_call_that_makes_a_sample_alone_is_timed_alone(monkeypatch):
    ms, log = _timed(monkeypatch, 1)
    assert log == ["event", "call", "event"]
    assert ms == 2.0


def test_on_a_cpu_every_call_is_timed(monkeypatch):
    calls = []
    timing.time_once(lambda: calls.append(1), torch.device("cpu"), 3)
    assert len(calls) == 3
