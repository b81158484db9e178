"""Discovery, interception and routing on tiny real diffusers models."""

import dataclasses
import logging

import pytest
import torch
import torch.nn.functional as F

import ditgate
from ditgate.gate.profiles import PROFILES
from ditgate.hosts import find_attention_modules

from .helpers import TINY, FakeForm, Tiny


def _count_sdpa_calls(monkeypatch, tiny: Tiny) -> int:
    """Attention calls of one unattached forward, counted at torch's SDPA (what every host path reaches)."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    tiny.forward()
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", real)
    return len(calls)


# SDPA calls a forward makes outside any attention module: Mochi's time embedding pools the caption with one
# query (MochiAttentionPool calls F.scaled_dot_product_attention itself, with no processor to route)
OUTSIDE_MODULES = {"tiny-mochi": 1}


@pytest.mark.parametrize("name", TINY)
def test_discovery_finds_every_attention_call(monkeypatch, name):
    tiny = Tiny(name)
    expected_calls = _count_sdpa_calls(monkeypatch, tiny) - OUTSIDE_MODULES.get(tiny.preset.name, 0)
    assert expected_calls > 0
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False)
    tiny.forward()
    report = plan.report()
    assert sum(s.calls for s in report.sites) == expected_calls
    assert all(s.calls == 1 for s in report.sites)  # one call per site per forward at these configs
    assert len({s.name for s in report.sites}) == len(report.sites)
    assert not report.skipped
    plan.detach()


def test_sites_have_module_paths_and_roles():
    wan = Tiny("tiny-wan")
    plan = ditgate.attach(wan.model, forms=["sdpa_math"], measure=False)
    wan.forward()
    roles = {s.name: s.role for s in plan.report().sites}
    assert roles == {"blocks.0.attn1": "self", "blocks.0.attn2": "cross", "blocks.1.attn1": "self",
                     "blocks.1.attn2": "cross"}
    plan.detach()
    flux = Tiny("tiny-flux")
    plan = ditgate.attach(flux.model, forms=["sdpa_math"], measure=False)
    flux.forward()
    roles = {s.name: s.role for s in plan.report().sites}
    assert roles["transformer_blocks.0.attn"] == "joint"
    assert roles["single_transformer_blocks.0.attn"] == "self"
    plan.detach()


@pytest.mark.parametrize("name", TINY)
def test_routed_outputs_match_the_host(name):
    tiny = Tiny(name)
    host = tiny.forward()
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False)
    routed = tiny.forward()
    assert all(s.serving == "sdpa_math" for s in plan.report().sites), plan.explain()
    # sdpa_math is exact: same function as the host's SDPA up to float32 rounding
    assert (routed - host).norm() / host.norm() < 1e-5
    plan.detach()


class _SiteNames(FakeForm):
    """Exact SDPA that records the site each call names (``AttentionInputs.site``)."""

    def __init__(self) -> None:
        super().__init__("site_names")
        self.sites: list[str | None] = []

    def run(self, inputs):
        self.sites.append(inputs.site)
        return super().run(inputs)


@pytest.mark.parametrize("measure", [False, True], ids=["static", "measured"])
def test_each_call_names_its_site_the_same_way_every_forward(measure):
    """Forms that keep statistics from one call of a site to its next (fa3_fp8's carried scales) key them by the
    site the router names: one name per site, the plan's own, the same at every forward and in the gate's calls."""
    tiny = Tiny("tiny-wan")
    form = _SiteNames()
    # measured: floors the exact stand-in always passes, so that which sites it serves does not hang on CPU timing
    lenient = dataclasses.replace(PROFILES["quality"], name="lenient", min_speedup=1e-3, min_whole_ratio=1e-3,
                                  screen_margin=None, rounds=3)
    plan = ditgate.attach(tiny.model, forms=["site_names"], measure=measure, extra_forms=[form],
                          **({"profile": lenient} if measure else {}))
    seen = []
    for _ in range(3):
        form.sites.clear()
        tiny.forward()
        seen.append(list(form.sites))
    names = [s.name for s in plan.report().sites]
    assert len(set(names)) == len(names) and all(set(sites) == set(names) for sites in seen)
    assert seen[1] == seen[2] and len(seen[1]) == len(names)  # once per site, in the same order, once routed
    plan.detach()


def test_a_raising_form_is_counted_and_the_call_returns_the_host_result(caplog):
    tiny = Tiny("tiny-wan")
    host = tiny.forward()
    boom = FakeForm("boom", raises=True)
    plan = ditgate.attach(tiny.model, forms=["boom"], measure=False, extra_forms=[boom])
    with caplog.at_level(logging.WARNING, logger="ditgate"):
        outs = [tiny.forward() for _ in range(4)]
    for out in outs:
        assert torch.equal(out, host)
    report = plan.report()
    for site in report.sites:
        (failure,) = site.failures
        assert failure.form == "boom" and failure.failures == 3 and failure.disabled
        assert "exploded on purpose" in failure.last_error
        assert site.serving == "host"
    assert boom.calls == 3 * len(report.sites)  # after three failures the site stops trying
    disabled_msgs = [r for r in caplog.records if "disabled after 3 failures" in r.getMessage()]
    assert len(disabled_msgs) == len(report.sites)  # said once per site
    plan.detach()


def test_unsupported_call_goes_to_host_with_the_reason():
    tiny = Tiny("tiny-ltx")  # its cross-attention carries an additive mask
    no_masks = FakeForm("nomask", masks=frozenset({ditgate.forms.MaskKind.NONE}))
    plan = ditgate.attach(tiny.model, forms=["nomask"], measure=False, extra_forms=[no_masks])
    tiny.forward()
    sites = {s.name: s for s in plan.report().sites}
    assert sites["transformer_blocks.0.attn1"].serving == "nomask"
    cross = sites["transformer_blocks.0.attn2"]
    assert cross.serving == "host"
    assert any("mask kind additive not supported" in r.reason for r in cross.routes)
    plan.detach()


def test_route_observer_reports_each_distinct_route_once(monkeypatch, capsys):
    monkeypatch.setenv("DITGATE_LOG_ROUTES", "1")
    events = []
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, on_route=events.append)
    tiny.forward()
    tiny.forward()
    assert len(events) == 4  # four sites, one route each, reported once despite two forwards
    e = events[0]
    assert e.route == "sdpa_math" and e.dtype == "float32" and e.mask == "none" and "q[1,2,32,16]" in e.shapes
    assert capsys.readouterr().err.count("ditgate route:") == 4
    plan.detach()


def test_report_is_typed_and_serialisable(tmp_path):
    import json

    tiny = Tiny("tiny-flux")
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False)
    tiny.forward()
    report = plan.report()
    path = report.save(tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["mode"] == "static" and len(data["sites"]) == 2
    assert data["sites"][0]["routes"][0] == {"route": "sdpa_math", "reason": "", "calls": 1}
    text = plan.explain()
    assert "transformer_blocks.0.attn" in text and "sdpa_math" in text
    plan.detach()


def test_unknown_form_name_is_an_error_listing_known_forms():
    tiny = Tiny("tiny-wan")
    with pytest.raises(ditgate.UnknownFormError, match="known forms: .*sdpa_math"):
        ditgate.attach(tiny.model, forms=["nope"])
    with pytest.raises(ditgate.UnknownFormError):
        ditgate.attach(tiny.model, forms=["nope"], measure=False)
    assert all(type(m.module.processor).__name__ == "WanAttnProcessor"
               and not getattr(type(m.module.processor), "_ditgate_routed", False)
               for m in find_attention_modules(tiny.model))


def test_sdpa_convention_processors_are_intercepted_without_touching_F():
    tiny = Tiny("tiny-pixart")
    real = F.scaled_dot_product_attention
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False)
    assert F.scaled_dot_product_attention is real and torch.nn.functional.scaled_dot_product_attention is real
    tiny.forward()
    assert all(s.convention == "F.scaled_dot_product_attention" for s in plan.report().sites)
    assert all(s.serving == "sdpa_math" for s in plan.report().sites)
    plan.detach()
