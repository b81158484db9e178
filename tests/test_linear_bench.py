"""``ditgate bench model --linear``: rows with and without linear forms, and the weights each row keeps resident."""

import pytest
import torch

import ditgate
from ditgate.cli.bench_model import device_weight_bytes, ditgate_rows
from ditgate.gate.linear import LinearSetting

from .helpers import Tiny


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
