"""``ditgate bench model --linear``: rows with and without linear forms, and the weights each row keeps resident."""

import pytest
import torch

import ditgate
from ditgate.cli.bench_model import device_weight_bytes, ditgate_rows
from ditgate.gate.linear import LinearSetting
from ditgate.hosts.linears import find_linear_sites

from .helpers import LENIENT_SPEED, Tiny


def test_linear_rows_stand_beside_each_bounded_row():
    rows = ditgate_rows(["quality", "speed"], linear=LinearSetting())
    assert [r.key for r in rows] == ["quality", "speed", "speed +linear"]
    assert rows[2].linear == LinearSetting() and rows[1].linear is None
    with pytest.raises(ValueError, match="none of the profiles"):
        ditgate_rows(["quality"], linear=LinearSetting())


def test_both_activation_quantizations_make_a_linear_row_each_for_one_run():
    apart, fused = LinearSetting(), LinearSetting(activation_quantization="fused")
    rows = ditgate_rows(["speed"], linear=[apart, fused])
    assert [r.key for r in rows] == ["speed", "speed +linear", "speed +linear fused"]
    assert rows[1].linear == apart and rows[2].linear == fused
    assert rows[1].plan_of is None and rows[2].plan_of == "speed +linear"  # the A/B runs one plan
    with pytest.raises(ValueError, match="twice"):
        ditgate_rows(["speed"], linear=[fused, fused])


def test_resident_weight_bytes_count_the_8_bit_weights_in_place_of_the_hosts():
    tiny = Tiny("tiny-wan")
    device = torch.device("cpu")
    stock = device_weight_bytes(tiny.model, device)
    assert stock == sum(t.numel() * t.element_size() for t in [*tiny.model.parameters(), *tiny.model.buffers()])
    plan = ditgate.attach(tiny.model, measure=False, linear=["int8_linear"])
    sites = plan.linear.routers
    host = sum(r.custody.original.numel() * 4 for r in sites)
    payload = sum(r.custody.payload().nbytes for r in sites)
    assert device_weight_bytes(tiny.model, device, plan) == stock - host + payload < stock
    plan.detach()
    assert device_weight_bytes(tiny.model, device) == stock


@pytest.mark.slow  # a subprocess that calibrates a tiny model with linear forms and compiles it four times
def test_the_later_linear_row_re_applies_the_first_rows_plan(tmp_path):
    """An A/B of the activation setting runs one plan: the fused row re-applies the apart row's receipt instead of
    calibrating again (two calibrations can route different sites), and says so; both serve the same sites, eagerly
    and compiled (where the setting matters)."""
    import json
    import subprocess
    import sys

    from ditgate.forms.linear import create_linear_forms

    avail = create_linear_forms(["int8_linear"])["int8_linear"].availability()
    if not avail.available:
        pytest.skip(avail.reason)
    res = subprocess.run([sys.executable, "-m", "ditgate.cli.main", "bench", "model", "--preset", "tiny-wan",
                          "--layers", "1", "--backends", "native", "--profiles", "speed", "--linear",
                          "--linear-forms", "int8_linear", "--activation-quantization", "apart", "fused",
                          "--rounds", "1", "--compile", "default", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads((tmp_path / "bench-model-tiny-wan-1l.json").read_text())
    rows = {r["name"]: r for r in data["rows"]}
    apart, fused = rows["ditgate speed +linear"], rows["ditgate speed +linear fused"]
    assert apart["status"] == fused["status"] == "ok"
    assert "re-applied" not in apart["detail"] and "calibration" in apart["detail"]
    assert "the plan of 'speed +linear' re-applied" in fused["detail"]
    assert apart["detail"].split("sites: ")[1] == fused["detail"].split("sites: ")[1]
    receipts = {key: json.loads(data["receipts"][key]) for key in ("speed +linear", "speed +linear fused")}
    routes = {key: sorted((v["site"], v["shape_key"], v["form"] or "") for v in r["verdicts"])
              for key, r in receipts.items()}
    assert routes["speed +linear"]  # the plan has verdicts to compare
    assert routes["speed +linear"] == routes["speed +linear fused"]
    apart, fused = rows["ditgate speed +linear + compile"], rows["ditgate speed +linear fused + compile"]
    assert apart["status"] == fused["status"] == "ok", (apart["reason"], fused["reason"])
    assert apart["detail"].startswith("1 rounds") and "calibration" in apart["detail"]
    assert "the plan of 'speed +linear' re-applied" in fused["detail"]
    assert apart["detail"].split("sites: ")[1] == fused["detail"].split("sites: ")[1]


def test_a_compiled_row_re_applies_the_plan_it_names_with_its_own_setting():
    """The fused compiled row attaches from the named row's receipt: the same linear routes (here some int8 ones, a
    lenient profile making the form win on a CPU) under the fused setting, and no calibration of its own."""
    from ditgate.cli.bench_compile import _make
    from ditgate.cli.bench_model import DitgateRow
    from ditgate.forms.linear import create_linear_forms

    avail = create_linear_forms(["int8_linear"])["int8_linear"].availability()
    if not avail.available:
        pytest.skip(avail.reason)
    lenient = LENIENT_SPEED
    tiny = Tiny("tiny-wan")
    with torch.no_grad():
        plan = ditgate.attach(tiny.model, profile=lenient, forms=["sdpa_math"], timing_cache=False, progress=False,
                              linear=LinearSetting(forms=("int8_linear",), compiled=True))
        tiny.forward()
    receipt = plan.receipt()
    wanted = sum(1 for s in plan.report().linear.sites if s.weights == "int8_linear")
    after = {s.path for s in find_linear_sites(tiny.model) if s.after_activation}
    routed_after = sum(1 for s in plan.report().linear.sites if s.weights == "int8_linear" and s.name in after)
    plan.detach()
    assert wanted  # the receipt routes some linear sites to the form
    row = DitgateRow("speed +linear fused", profile="speed", plan_of="speed +linear",
                     linear=LinearSetting(forms=("int8_linear",), activation_quantization="fused"))
    cfg = _make("ditgate speed +linear fused + compile", "default", tiny.model, row, tiny.inputs,
                torch.device("cpu"), {}, {("default", "speed +linear"): receipt})
    assert cfg.status == "ok", cfg.reason
    assert cfg.detail.startswith("the plan of 'speed +linear' re-applied") and "(receipt)" in cfg.detail
    assert routed_after and f"; {routed_after} routed linear site(s) take an activation's output" in cfg.detail
    assert cfg.served["linear int8_linear"] == wanted
    missing = _make("x", "default", tiny.model, row, tiny.inputs, torch.device("cpu"), {}, {})
    assert missing.status == "raised" and "made none" in missing.reason


def test_only_keeps_a_row_whose_plan_row_it_dropped_calibrating_its_own():
    from ditgate.cli.bench_model import only_rows

    rows = ditgate_rows(["balanced", "speed"], linear=[LinearSetting(), LinearSetting(activation_quantization="fused")])
    assert [(r.key, r.plan_of) for r in only_rows(rows, ["speed +linear"])] == [
        ("speed +linear", None), ("speed +linear fused", "speed +linear")]
    assert [(r.key, r.plan_of) for r in only_rows(rows, ["linear fused"])] == [
        ("balanced +linear fused", None), ("speed +linear fused", None)]


def test_the_device_time_flag_reaches_every_linear_setting_and_needs_linear():
    from argparse import Namespace

    from ditgate.cli.bench import _linear_settings

    args = Namespace(linear=True, linear_forms=None, activation_quantization=["apart", "fused"],
                     linear_device_time=True, linear_roles=None)
    assert [(s.activation_quantization, s.device_time) for s in _linear_settings(args)] == [("apart", True),
                                                                                            ("fused", True)]
    assert not any(s.device_time for s in _linear_settings(Namespace(**{**vars(args), "linear_device_time": False})))
    with pytest.raises(ValueError, match="--linear-roles need --linear"):
        _linear_settings(Namespace(**{**vars(args), "linear": False, "activation_quantization": None}))


def test_linear_roles_name_roles_or_groups_and_reach_every_setting():
    from argparse import Namespace

    from ditgate.cli.bench import _linear_settings
    from ditgate.hosts.linears import ALL_ROLES, TOKEN_ROLES

    args = Namespace(linear=True, linear_forms=None, activation_quantization=["apart", "fused"],
                     linear_device_time=False, linear_roles=["token", "modulation", "attn.q"])
    settings = _linear_settings(args)
    assert [s.roles for s in settings] == [TOKEN_ROLES + ("modulation",)] * 2  # each role once, in order
    assert _linear_settings(Namespace(**{**vars(args), "linear_roles": ["all"]}))[0].roles == ALL_ROLES
    assert _linear_settings(Namespace(**{**vars(args), "linear_roles": None}))[0].roles is None
    with pytest.raises(ValueError, match="unknown linear role.*groups: token, all"):
        _linear_settings(Namespace(**{**vars(args), "linear_roles": ["tokens"]}))
    with pytest.raises(ValueError, match="need --linear"):
        _linear_settings(Namespace(**{**vars(args), "linear": False, "activation_quantization": None,
                                      "linear_roles": ["token"]}))


@pytest.mark.slow  # compiles two copies of a tiny model with inductor
def test_compiled_rows_are_explained_after_their_rounds_so_routed_sites_read_their_form(monkeypatch):
    """A compiled row's calls run none of ditgate's Python; explained right after calibration, every routed linear
    site read "host" (only the calibration's calls were counted). Explained after the timed rounds, a site says what
    its graphs traced."""
    from ditgate.api.plan import Plan
    from ditgate.cli.bench_compile import bench_compiled
    from ditgate.cli.bench_model import DitgateRow
    from ditgate.forms.linear import create_linear_forms
    from ditgate.models.presets import get_preset

    avail = create_linear_forms(["int8_linear"])["int8_linear"].availability()
    if not avail.available:
        pytest.skip(avail.reason)
    # what each explanation would say of the routed sites: the route each served most
    monkeypatch.setattr(Plan, "explain", lambda self: sorted(
        {s.serving for s in self.report().linear.sites if s.weights == "int8_linear"}))
    preset = get_preset("tiny-wan").with_layers(1)
    model = preset.build("cpu", torch.float32)
    row = DitgateRow("speed +linear", profile=LENIENT_SPEED,
                     linear=LinearSetting(forms=("int8_linear",), compiled=True))
    explains: dict = {}
    torch._dynamo.reset()
    rows = bench_compiled(preset, model, torch.device("cpu"), torch.float32, [row], rounds=1, explains=explains)
    torch._dynamo.reset()
    assert all(r.status == "ok" for r in rows), [(r.name, r.reason) for r in rows]
    assert explains["ditgate speed +linear + compile"] == ["int8_linear"]
