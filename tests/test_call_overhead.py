"""The router's hot path: a call whose signature was seen before is served from the site's route cache (counts, not
timing), and anything a route depends on changing makes the sites decide again."""

import dataclasses

import torch

import ditgate
from ditgate.cli.bench_overhead import measure_overhead
from ditgate.gate import PROFILES
from ditgate.router import StaticChooser

from .helpers import FakeForm, Tiny, twice

LENIENT = dataclasses.replace(PROFILES["quality"], name="lenient", min_speedup=1e-3, min_whole_ratio=1e-3, rounds=3)


class CountingChooser(StaticChooser):
    """The static chooser, counting how often it is asked."""

    def __init__(self, order):
        super().__init__(order)
        self.asked = 0

    def decide(self, site, call):
        self.asked += 1
        return super().decide(site, call)


def _sites(plan):
    return [s for a in plan._attached for s in a.router.sites.values()]


def test_repeated_calls_are_served_from_the_route_cache():
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False)
    chooser = plan.context.chooser = CountingChooser(("sdpa_math",))
    for _ in range(5):
        tiny.forward()
    assert chooser.asked == 4  # once per site, for the one signature each site met
    assert all(s.resolved == 1 and s.ledger.calls == 5 for s in _sites(plan))
    tiny.inputs = twice(tiny.inputs)
    tiny.forward()
    tiny.forward()
    assert chooser.asked == 8  # a new signature (batch 2) is decided once more per site
    plan.detach()


def test_an_invalidation_makes_every_site_decide_again():
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False)
    tiny.forward()
    plan.context.invalidate()
    tiny.forward()
    tiny.forward()
    assert all(s.resolved == 2 for s in _sites(plan))
    plan.detach()


def test_a_disabled_form_is_decided_again_and_the_host_serves():
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, forms=["boom"], measure=False, extra_forms=[FakeForm("boom", raises=True)])
    generation = plan.context.generation
    for _ in range(5):
        tiny.forward()
    assert plan.context.generation == generation + 4  # each site's disabling invalidated the routes
    for site in _sites(plan):
        hosted = {why: n for (route, why), n in site.ledger.routes.items() if route == "host"}
        assert hosted.pop("boom raised") == 3
        ((why, calls),) = hosted.items()
        assert "boom: disabled after 3 failures" in why and calls == 2
    plan.detach()


def test_a_measuring_plan_decides_again_after_calibration_then_hits():
    tiny = Tiny("tiny-wan")
    plan = ditgate.attach(tiny.model, profile=LENIENT, forms=["copy"], extra_forms=[FakeForm("copy")])
    tiny.forward()  # calibration, whole-model check: the chooser's mode and verdicts change its generation
    resolved = [s.resolved for s in _sites(plan)]
    for _ in range(3):
        tiny.forward()
    assert [s.resolved for s in _sites(plan)] == [n + 1 for n in resolved]  # decided once more, then cached
    assert all(s.ledger.routes[("copy", "")] == 3 for s in _sites(plan))
    plan.detach()


def test_the_overhead_benchmark_runs_on_cached_routes():
    result = measure_overhead(calls=50, rounds=2)
    assert result.resolved_while_timed == 0
    assert result.overhead_us == result.routed_us - result.direct_us
    assert result.routed_us > 0 and result.direct_us > 0 and result.host_us > 0
    assert torch.get_num_threads() >= 1
