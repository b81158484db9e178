"""Triton made ready in a thread from attach on (``gate.triton_warm``): its cache key, so that the first launch
finds it made, and the contest waiting for it only before forms of Triton kernels."""

import dataclasses
import importlib
import threading

import pytest
import torch

import ditgate
from ditgate.gate import triton_warm
from ditgate.models.presets import get_preset

from .helpers import FakeForm, Tiny


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setattr(triton_warm, "_thread", None)
    monkeypatch.setattr(triton_warm, "_key_made", threading.Event())
    monkeypatch.setattr(triton_warm, "_agreement_ready", set())


def test_the_key_is_made_in_a_thread_once_and_later_callers_find_it_made(fresh_state, monkeypatch):
    from triton.runtime.cache import triton_key

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    triton_key.cache_clear()
    assert triton_warm.start(torch.device("cpu"), torch.bfloat16)
    thread = triton_warm._thread
    assert thread is not None and thread.name == "ditgate-triton-warm" and thread.daemon
    assert triton_warm.start(torch.device("cpu"), torch.bfloat16) and triton_warm._thread is thread  # once
    assert triton_warm.wait_for_key() >= 0.0
    thread.join()
    assert triton_key.cache_info().currsize == 1  # the first launch's own call is a hit
    assert triton_warm.wait_for_key() == 0.0
    assert not triton_warm.agreement_ready(torch.device("cpu"), torch.bfloat16)  # the kernel is CUDA's only


def test_nothing_starts_under_the_interpreter_or_for_a_model_on_the_cpu(fresh_state, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_warm.start(torch.device("cuda"), torch.bfloat16) and triton_warm._thread is None
    monkeypatch.delenv("TRITON_INTERPRET")
    tiny = Tiny(get_preset("tiny-wan"))
    plan = ditgate.attach(tiny.model, profile="quality", timing_cache=False)
    tiny.forward()
    plan.detach()
    assert triton_warm._thread is None
    assert triton_warm.wait_for_key() == 0.0


class Logged(FakeForm):
    def __init__(self, name: str, log: list, triton: bool) -> None:
        super().__init__(name)
        self.log = log
        self.compiles_ahead = triton

    def run(self, inputs):
        self.log.append(f"run {self.name}")
        return super().run(inputs)


def test_the_contest_waits_for_the_key_before_the_first_call_of_a_triton_form_only(monkeypatch):
    contest = importlib.import_module("ditgate.gate.contest")  # (ditgate.gate.contest is also a function)
    log: list[str] = []
    monkeypatch.setattr(contest, "wait_for_key", lambda: log.append("wait") or 0.0)
    forms = [Logged("kernels", log, triton=True), Logged("library", log, triton=False)]
    preset = get_preset("tiny-wan")
    tiny = Tiny(dataclasses.replace(preset, config={**preset.config, "num_layers": 1}))
    ditgate.attach(tiny.model, profile="quality", forms=["kernels", "library"], extra_forms=forms, timing_cache=False)
    tiny.forward()
    first = log.index("run kernels")
    assert first > 0 and log[first - 1] == "wait", log[:12]
    other = log.index("run library")
    assert other == 0 or log[other - 1] != "wait", log[:12]
