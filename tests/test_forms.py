import pytest
import torch

import ditgate
from ditgate.forms import (
    AttentionCall,
    Availability,
    Form,
    MaskKind,
    UnknownFormError,
    create_forms,
    describe_call,
    describe_forms,
    known_form_names,
    spec_reasons,
)


def _call(**kw) -> AttentionCall:
    base = dict(batch=1, heads_q=4, heads_kv=4, seq_q=64, seq_kv=64, head_dim=64, head_dim_v=64, dtype="bfloat16",
                device_type="cuda", capability=(9, 0), mask=MaskKind.NONE, is_causal=False, dropout_p=0.0,
                enable_gqa=False, needs_grad=False)
    base.update(kw)
    return AttentionCall(**base)


def test_every_shipped_form_is_registered():
    assert {"fa4", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "sdpa_math", "flex", "sage"} <= set(known_form_names())


def test_unknown_form_names_list_the_known_ones():
    with pytest.raises(UnknownFormError) as err:
        create_forms(["fa4", "warp_drive"])
    assert "warp_drive" in str(err.value) and "sdpa_cudnn" in str(err.value)


def test_doctor_gives_a_reason_for_every_unavailable_form():
    infos = describe_forms()
    assert {i.name for i in infos} == set(known_form_names())
    for i in infos:
        assert i.available or i.reason, i
    if not torch.cuda.is_available():
        cuda_only = {i.name: i for i in infos if i.envelope["devices"] == ["cuda"]}
        assert cuda_only and all(not i.available for i in cuda_only.values())


def test_unsupported_calls_give_reasons_from_the_envelope():
    forms = create_forms()
    cpu_call = _call(device_type="cpu", dtype="float32", capability=None)
    assert forms["sdpa_math"].not_supported_reasons(cpu_call) == []
    text = " ".join(spec_reasons(forms["sdpa_cudnn"].spec,
                                 _call(mask=MaskKind.BOOLEAN, head_dim=256, head_dim_v=256, dtype="float32")))
    assert "mask kind boolean" in text and "head dim 256" in text and "dtype float32" in text
    flex_reasons = spec_reasons(forms["flex"].spec, _call(is_causal=True, head_dim=80, head_dim_v=80))
    assert any("causal" in r for r in flex_reasons) and any("head dim 80" in r for r in flex_reasons)


def test_capability_and_gqa_reasons():
    forms = create_forms()
    assert any("compute capability" in r for r in spec_reasons(forms["fa4"].spec, _call(capability=(8, 0))))
    assert any("grouped-query" in r for r in spec_reasons(forms["sdpa_cudnn"].spec, _call(heads_kv=2)))
    assert any("not a multiple" in r for r in spec_reasons(forms["fa4"].spec, _call(heads_q=6, heads_kv=4)))


def test_a_probe_that_raises_is_a_reason_not_an_exception():
    class Broken(Form):
        spec = create_forms(["sdpa_math"])["sdpa_math"].spec

        def _probe(self) -> Availability:
            raise ImportError("libfoo.so: cannot open shared object file")

    reasons = Broken().not_supported_reasons(_call(device_type="cpu", dtype="float32"))
    assert len(reasons) == 1 and "probe failed" in reasons[0] and "libfoo" in reasons[0]


def test_describe_call_reads_layout_mask_and_grad():
    q = torch.randn(2, 4, 10, 16)
    k = torch.randn(2, 2, 7, 16, requires_grad=True)
    v = torch.randn(2, 2, 7, 16)
    call = describe_call(q, k, v, torch.zeros(2, 1, 1, 7, dtype=torch.bool), 0.0, False, True, None)
    assert (call.batch, call.heads_q, call.heads_kv, call.seq_q, call.seq_kv) == (2, 4, 2, 10, 7)
    assert call.mask is MaskKind.BOOLEAN and call.needs_grad
    assert "Sq10:Skv7" in call.shape_key and "mask=boolean" in call.shape_key
    with torch.no_grad():
        assert not describe_call(q, k, v, None, 0.0, False, True, None).needs_grad


def test_math_and_flex_forms_match_sdpa_on_cpu():
    from ditgate.forms import AttentionInputs

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 32, dtype=torch.float64) for _ in range(3))
    ref = torch.softmax(q @ k.transpose(-1, -2) / 32 ** 0.5, -1) @ v
    forms = create_forms(["sdpa_math", "flex"])
    inputs = AttentionInputs(q.float(), k.float(), v.float())
    for form in forms.values():
        out = form.run(inputs).double()
        assert (out - ref).norm() / ref.norm() < 1e-5, form.name


@pytest.mark.slow
def test_flex_on_cpu_refuses_the_key_lengths_its_kernel_gets_wrong_and_serves_the_others():
    """At head dim 16 torch's compiled CPU flex returned NaN or wrong rows for key lengths of 8 mod 16 (a tiny model's
    8 text tokens): the form refuses those calls, and serves a multiple of 16 exactly."""
    from ditgate.forms import AttentionInputs

    flex = create_forms(["flex"])["flex"]
    cpu = dict(device_type="cpu", dtype="float32", capability=None, head_dim=16, head_dim_v=16)
    assert any("multiple of 16" in r for r in flex.not_supported_reasons(_call(seq_kv=24, **cpu)))
    assert flex.not_supported_reasons(_call(seq_kv=32, **cpu)) == []
    assert flex.not_supported_reasons(_call(seq_kv=24, **{**cpu, "head_dim": 64, "head_dim_v": 64})) == []
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(flex.run(AttentionInputs(q, k, v)), ref, atol=1e-5)


def test_package_exports():
    assert callable(ditgate.attach) and ditgate.__version__


def test_only_the_math_form_refuses_a_huge_score_matrix():
    forms = create_forms()
    big = _call(seq_q=32760, seq_kv=32760, heads_q=12, heads_kv=12, head_dim=128, head_dim_v=128)
    assert any("score matrix" in r for r in forms["sdpa_math"].extra_reasons(big))
    assert forms["sdpa_efficient"].extra_reasons(big) == []
    assert forms["sdpa_math"].extra_reasons(_call()) == []
