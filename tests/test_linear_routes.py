"""A linear site replays its resolved route per call signature: hundreds of linear calls per forward must not each
pay the decision's Python. A new generation (verdict, mode), a moved weight or a raising form decides again."""

import torch

import ditgate

from .helpers import Tiny


def _plan(tiny, **kw):
    return ditgate.attach(tiny.model, forms=["sdpa_math"], measure=False, linear=["int8_linear"], **kw)


def _counting_describe(plan):
    counts = {}
    for router in plan.linear.routers:
        real = router.describe

        def describe(x, real=real, name=router.name):
            counts[name] = counts.get(name, 0) + 1
            return real(x)

        router.describe = describe
    return counts


def test_each_signature_is_decided_once_then_replayed():
    tiny = Tiny("tiny-wan")
    host = tiny.forward()
    plan = _plan(tiny)
    counts = _counting_describe(plan)
    first = tiny.forward()
    decided = dict(counts)
    for _ in range(3):
        again = tiny.forward()
    assert counts == decided and decided  # three more forwards, not one more decision
    assert torch.equal(again, first)
    served = {r.name: r.ledger.calls for r in plan.linear.routers}
    assert all(n == 4 for n in served.values()), served  # every call still counted
    assert any(r._routes for r in plan.linear.routers)
    plan.detach()
    assert torch.equal(tiny.forward(), host)


def test_a_new_generation_or_a_moved_weight_decides_again():
    tiny = Tiny("tiny-wan")
    plan = _plan(tiny)
    counts = _counting_describe(plan)
    tiny.forward()
    decided = sum(counts.values())
    plan.context.invalidations += 1  # what a disabled form or a new verdict does
    tiny.forward()
    assert sum(counts.values()) == 2 * decided
    with torch.no_grad():
        tiny.forward(hidden_states=tiny.inputs["hidden_states"].double().float())  # same signature: replayed
    assert sum(counts.values()) == 2 * decided
    plan.detach()


def test_a_form_that_raises_is_decided_again_and_the_host_serves():
    tiny = Tiny("tiny-wan")
    host = tiny.forward()
    plan = _plan(tiny)
    tiny.forward()
    router = next(r for r in plan.linear.routers if r.custody.payload_form == "int8_linear")
    form = plan.linear.context.forms["int8_linear"]
    real = form.run
    form.run = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    out = tiny.forward()
    assert router.ledger.failures["int8_linear"] >= 1 and torch.isfinite(out).all()
    form.run = real
    plan.detach()
    assert torch.equal(tiny.forward(), host)
