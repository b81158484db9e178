"""ditgate inside diffusers' context parallelism: two gloo ranks on this CPU, tiny Wan and Flux.

Each rank gets one "device" of a CPU device mesh (diffusers sizes its mesh by the accelerator count, which is 0
here: the test hands ``enable_parallelism`` a mesh of its own and answers 1 for that one call). Ring runs on
diffusers' ``_native_flash`` backend, whose aten flash op has no CPU kernel: inside the rank processes it is
answered by torch's CPU flash kernel, which returns the same (output, log-sum-exp).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import time
from datetime import timedelta
from unittest import mock

import pytest
import torch

from ditgate.forms import AttentionInputs, Precision, create_forms, describe_call
from ditgate.gate import Measurement, Profile, Refusal, Verdict
from ditgate.gate.agree import settle
from ditgate.gate.receipt import Receipt
from ditgate.gate.verdict import OUTRANKED, SLOWER
from ditgate.hosts.parallel import ContextParallel

from .helpers import FakeForm, sdpa

WORLD = 2
# every form that passes the accuracy floor wins and the whole-model check takes nothing back for speed: on a shared
# CPU, timing decides nothing a test could assert; accuracy and agreement do. No screening: every candidate is run
# at every site, so what passed on each rank is known there.
PROFILE = Profile("cp-test", frozenset(Precision), min_call_cosine=0.9999, min_output_cosine=0.999,
                  min_speedup=1e-6, min_whole_ratio=0.0, rounds=1, whole_rounds=1, screen_margin=None)


class LseForm(FakeForm):
    """Exact attention that also returns its log-sum-exp (torch's CPU flash kernel): a form ring may use."""

    def run_lse(self, inputs: AttentionInputs) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            inputs.query, inputs.key, inputs.value, 0.0, False, scale=inputs.scale)[:2]


class RankZeroOnly(FakeForm):
    """Exact on rank 0, off by far more than the floor allows on every other rank; declared bounded, so that rank 0
    always prefers it (a bounded form needs only the speed threshold over the best exact one, here ~0)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, precision=Precision.BOUNDED)

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        out = sdpa(inputs)
        return out if torch.distributed.get_rank() == 0 else out + 0.1 * out.std()


def _cpu_flash(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, scale=None):
    """aten's CUDA flash op as diffusers' _native_flash backend calls it, from torch's CPU flash kernel."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                                           scale=scale)
    none = torch.empty(0)
    return out, lse, none, none, 0, 0, none, none, none


def _parallelise(model, ulysses: int = 1, ring: int = 1) -> None:
    from diffusers import ContextParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (ring, ulysses), mesh_dim_names=("ring", "ulysses"))
    with mock.patch("torch.accelerator.device_count", return_value=1):  # one CPU "device" per rank
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses, ring_degree=ring, mesh=mesh))


def _record(plan, out: torch.Tensor, stock: torch.Tensor) -> dict:
    report = plan.report()
    verdicts = getattr(plan.chooser, "verdicts", {})  # a plan that does not measure has none
    return {
        "diff": (out - stock).abs().max().item(),
        "served": {s.name: {c.route: c.calls for c in s.routes if c.route != "host"} for s in report.sites},
        "shapes": {s.name: s.shapes for s in report.sites},
        "verdicts": sorted((v.site, v.shape_key, v.form, v.note) for v in verdicts.values()),
        "refusals": {(v.site, r.form): r.detail for v in verdicts.values() for r in v.refusals},
    }


def _ulysses_wan(results: dict, tmp: str) -> None:
    import ditgate
    from ditgate.gate import ReceiptMismatchError, load_receipt
    from ditgate.hosts import is_routed

    from .helpers import Tiny

    wan, bystander = Tiny("tiny-wan"), Tiny("tiny-wan", seed=1)
    alone = bystander.forward()
    _parallelise(wan.model, ulysses=WORLD)
    stock = wan.forward()
    originals = [m.processor for m in wan.model.modules() if hasattr(m, "processor")]
    plan = ditgate.attach(wan.model, profile=PROFILE, forms=["sdpa_math", "rank0_only"],
                          extra_forms=[RankZeroOnly("rank0_only")])
    wan.forward()  # calibrates; the host serves it
    results["wan"] = _record(plan, wan.forward(), stock)
    results["bystander"] = (torch.equal(bystander.forward(), alone),
                            any(is_routed(m.processor) for m in bystander.model.modules() if hasattr(m, "processor")))
    receipt = plan.receipt()
    path = receipt.save(os.path.join(tmp, f"receipt-{torch.distributed.get_rank()}.json"))
    results["receipt_parallel"] = load_receipt(path).parallel
    plan.detach()
    results["detached"] = (torch.equal(wan.forward(), stock),
                           [m.processor for m in wan.model.modules() if hasattr(m, "processor")] == originals)
    again = ditgate.attach(wan.model, receipt=path, extra_forms=[RankZeroOnly("rank0_only")])
    results["from_receipt"] = (again.mode, _record(again, wan.forward(), stock)["served"])
    again.detach()
    try:
        ditgate.attach(bystander.model, receipt=path, extra_forms=[RankZeroOnly("rank0_only")])
        results["refused_elsewhere"] = ""
    except ReceiptMismatchError as exc:
        results["refused_elsewhere"] = str(exc)


def _parallelised_after_attach(results: dict) -> None:
    """enable_parallelism after attach: the calls carry the config and are served; detach leaves it in place."""
    import ditgate

    from .helpers import Tiny

    reference, wan = Tiny("tiny-wan"), Tiny("tiny-wan")
    _parallelise(reference.model, ulysses=WORLD)
    stock = reference.forward()
    plan = ditgate.attach(wan.model, forms=["sdpa_math"], measure=False)
    _parallelise(wan.model, ulysses=WORLD)
    results["late"] = _record(plan, wan.forward(), stock)
    plan.detach()
    results["late_detached"] = torch.equal(wan.forward(), stock)


def _ulysses_flux(results: dict) -> None:
    import ditgate

    from .helpers import Tiny

    from ditgate.models.presets import get_preset

    # 64 image tokens: four 16-token tiles, enough for the sparse stage to select over
    flux = Tiny(dataclasses.replace(get_preset("tiny-flux"), geometry=dict(height=16, width=16, text=8, patch_area=4)))
    _parallelise(flux.model, ulysses=WORLD)
    stock = flux.forward()
    sparse = ditgate.SparseSetting(ditgate.BudgetSchedule(0.5, dense_steps=0, dense_layers=0), block=16,
                                   forms=("flex_sparse",))
    plan = ditgate.attach(flux.model, profile=PROFILE, forms=["sdpa_math", "flex_sparse"], sparse=sparse)
    flux.forward()
    results["flux"] = _record(plan, flux.forward(), stock)
    plan.detach()


def _ring_wan(results: dict) -> None:
    import ditgate

    from .helpers import Tiny

    with mock.patch.object(torch.ops.aten, "_scaled_dot_product_flash_attention", _cpu_flash):
        wan = Tiny("tiny-wan")
        wan.model.set_attention_backend("_native_flash")
        _parallelise(wan.model, ring=WORLD)
        stock = wan.forward()
        lse = LseForm("cpu_flash_lse")
        plan = ditgate.attach(wan.model, profile=PROFILE, forms=["sdpa_math", "cpu_flash_lse"], extra_forms=[lse])
        wan.forward()
        results["ring"] = _record(plan, wan.forward(), stock)
        plan.detach()
        results["ring_detached"] = torch.equal(wan.forward(), stock)


def _rank(rank: int, port: int, tmp: str) -> None:
    # each rank's own timing cache, in the test's folder (the autouse fixture's is not set up yet for a module fixture)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DITGATE_CACHE_DIR=os.path.join(tmp, f"cache{rank}"))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    results: dict = {}
    try:
        _ulysses_wan(results, tmp)
        _parallelised_after_attach(results)
        _ulysses_flux(results)
        _ring_wan(results)
    finally:
        with open(os.path.join(tmp, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(results, f)
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Every rank's results of the scenarios above; a rank that hangs (a collective one rank never reaches) fails
    the test instead of stalling it."""
    tmp = str(tmp_path_factory.mktemp("cp"))
    ctx = torch.multiprocessing.start_processes(_rank, args=(_free_port(), tmp), nprocs=WORLD, join=False,
                                                start_method="spawn")
    deadline = time.monotonic() + 300
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the ranks did not finish within 300 s: a collective reached on one rank only?")
    out = []
    for rank in range(WORLD):
        with open(os.path.join(tmp, f"rank{rank}.pkl"), "rb") as f:
            out.append(pickle.load(f))
    return out


def _self_sites(record: dict) -> list[str]:
    return [name for name in record["served"] if name.endswith("attn1")]


@pytest.mark.slow
def test_ulysses_routes_the_local_op_on_every_rank_with_one_verdict(ranks):
    for r in ranks:
        wan = r["wan"]
        assert wan["diff"] < 1e-5
        for site in _self_sites(wan):  # the form ran after diffusers' exchange: the whole sequence, one head of two
            assert wan["served"][site].get("sdpa_math", 0) > 0
            assert all(s.startswith("q[1,1,32,16]") for s in wan["shapes"][site])
        # rank 0 chose rank0_only, rank 1 refused it: both take sdpa_math, which passed on both
        assert {form for _, _, form, _ in wan["verdicts"]} == {"sdpa_math"}
        assert all("ranks chose differently (rank 0: rank0_only, rank 1: sdpa_math)" in note
                   for _, _, _, note in wan["verdicts"])
    assert ranks[0]["wan"]["verdicts"] == ranks[1]["wan"]["verdicts"]
    flux = [r["flux"] for r in ranks]
    assert all(f["diff"] < 1e-5 and all(n.get("sdpa_math", 0) > 0 for n in f["served"].values()) for f in flux)
    assert flux[0]["verdicts"] == flux[1]["verdicts"]
    # the exchanged joint sequence is [text, image] of rank 0, then of rank 1: not the layout the stage read
    for site in flux[0]["served"]:
        assert "exchanged sequence" in flux[0]["refusals"][(site, "flex_sparse")]


@pytest.mark.slow
def test_ring_is_served_only_by_forms_that_return_the_log_sum_exp(ranks):
    for r in ranks:
        ring = r["ring"]
        assert ring["diff"] < 1e-5
        for site in _self_sites(ring):
            assert ring["served"][site].get("cpu_flash_lse", 0) > 0 and "sdpa_math" not in ring["served"][site]
            assert "log-sum-exp" in ring["refusals"][(site, "sdpa_math")]
        assert r["ring_detached"]
    assert ranks[0]["ring"]["verdicts"] == ranks[1]["ring"]["verdicts"]


@pytest.mark.slow
def test_detach_bystanders_receipts_and_late_parallelism(ranks):
    for r in ranks:
        assert r["detached"] == (True, True)
        assert r["bystander"] == (True, False)  # the model left unparallelised ran exactly as before, unrouted
        assert r["receipt_parallel"] == {"": ContextParallel(1, WORLD, WORLD).record()}
        mode, served = r["from_receipt"]
        assert mode == "receipt" and all(served[s].get("sdpa_math", 0) > 0 for s in _self_sites(r["wan"]))
        assert "context parallelism of (model)" in r["refused_elsewhere"]
        assert r["late"]["diff"] < 1e-5 and all(r["late"]["served"][s]["sdpa_math"] > 0 for s in _self_sites(r["late"]))
        assert r["late_detached"]


# --- in one process -----------------------------------------------------------------------------------------------
def _measurement(form: str, ratio: float, precision: str = "exact") -> Measurement:
    return Measurement(form, precision, ratio, ratio, ratio, 1.0, 1.0 / ratio, 1.0, 0.0, 0, 0)


def _verdict(form: str | None, ratios: dict[str, float], key: str = "B1") -> Verdict:
    measured = tuple(_measurement(f, x) for f, x in ratios.items())
    refusals = tuple(Refusal(f, OUTRANKED if x >= 1.02 else SLOWER, "") for f, x in ratios.items() if f != form)
    chosen = next((m for m in measured if m.form == form), None)
    return Verdict("site", key, form, "measured", chosen, measured, refusals)


def test_ranks_that_agree_keep_rank_zeros_verdict_word_for_word():
    first = _verdict("a", {"a": 1.3, "b": 1.1})
    assert settle([first, _verdict("a", {"a": 1.2, "b": 1.25})]) is first


def test_ranks_that_disagree_take_the_form_that_passed_everywhere_with_the_best_slowest_rank():
    settled = settle([_verdict("a", {"a": 1.3, "b": 1.2}), _verdict("b", {"a": 1.05, "b": 1.25})])
    assert settled.form == "b" and "1.200x on the slowest" in settled.note
    assert settle([_verdict("a", {"a": 1.3, "b": 1.0}), _verdict("b", {"a": 1.0, "b": 1.3})]).form is None
    assert settle([_verdict("a", {"a": 1.3}), _verdict(None, {"a": 0.9})]).form is None
    unrun = _verdict("b", {"a": 1.1, "b": 1.3})  # a: outranked on shared timing, never run on this rank
    unrun = dataclasses.replace(unrun, measured=(dataclasses.replace(unrun.measured[0], cosine=float("nan")),
                                                 unrun.measured[1]))
    assert settle([_verdict("a", {"a": 1.3, "b": 1.0}), unrun]).form is None


def test_ranks_that_saw_different_shapes_stay_on_the_host():
    settled = settle([_verdict("a", {"a": 1.3}), _verdict("a", {"a": 1.3}, key="B2")])
    assert settled.form is None and "different shapes" in settled.note


def test_a_receipt_is_refused_under_another_parallel_configuration():
    ulysses, ring = ContextParallel(1, 2, 2).record(), ContextParallel(2, 1, 2).record()
    receipt = Receipt({}, {}, Profile("p", frozenset(Precision), 0.9, 0.9), (), (), "now", parallel={"": ulysses})
    assert receipt.check_environment({}, {}, {"": ulysses}) == []
    assert "receipt ring_anything=False, ring_degree=1" in receipt.check_environment({}, {}, {"": ring})[0]
    assert "here none" in receipt.check_environment({}, {})[0]
    assert dataclasses.replace(receipt, parallel={}).check_environment({}, {}, {"": ring})[0].endswith(
        "receipt none, here ring_anything=False, ring_degree=2, ulysses_anything=False, ulysses_degree=1, "
        "world_size=2")


def test_the_forms_that_return_the_log_sum_exp_say_so_and_give_it_per_query_row():
    forms = create_forms()
    assert sorted(n for n, f in forms.items() if f.returns_lse) == ["fa3", "sdpa_cudnn", "sdpa_efficient", "sdpa_flash"]
    q = torch.empty(1, 2, 100, 64, device="meta", dtype=torch.bfloat16)  # shapes from the aten ops' meta kernels
    for name in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient"):
        out, lse = forms[name].run_lse(AttentionInputs(q, q, q))
        assert out.shape == q.shape and lse.shape == (1, 2, 100) and lse.dtype == torch.float32
    with pytest.raises(NotImplementedError, match="returns no log-sum-exp"):
        forms["sdpa_math"].run_lse(AttentionInputs(q, q, q))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_log_sum_exp_of_each_cuda_form_matches_the_scores():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4, 1000, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    scores = (q.float() @ k.float().transpose(-1, -2)) / 128 ** 0.5
    want_lse, want_out = torch.logsumexp(scores, -1), torch.softmax(scores, -1) @ v.float()
    forms = create_forms()
    for name in ("fa3", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient"):
        if forms[name].not_supported_reasons(describe_call(q, k, v, None, 0.0, False, False,
                                                           torch.cuda.get_device_capability())):
            continue
        out, lse = forms[name].run_lse(AttentionInputs(q, k, v))
        assert torch.allclose(lse, want_lse, atol=2e-2), name
        assert torch.nn.functional.cosine_similarity(out.float().flatten(), want_out.flatten(), dim=0) > 0.9999, name
