"""``ditgate bench kernels``: every form at the attention shapes of real models.

Per shape: random (never zero) B, S, H, D inputs like diffusers' dispatcher hands them, each form's
cold first call, then warm calls timed one by one (CUDA events on the GPU) with median, min and max;
TFLOP/s as 4·H·S²·D / time; cosine against a float32 reference on a *fresh* input set. Ratios are to cuDNN
(the fastest row where cuDNN did not run); each row's detail also gives its ratio to the fastest exact form.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ..forms import AttentionInputs, Precision, create_forms, describe_call
from ..gate import compare
from ..gate.timing import time_once, warm_samples
from .bench_output import BenchRow


@dataclass(frozen=True)
class KernelShape:
    name: str
    heads: int
    seq: int
    head_dim: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 4.0 * self.batch * self.heads * self.seq * self.seq * self.head_dim

    @property
    def label(self) -> str:
        return f"{self.name} {self.heads}x{self.seq}x{self.head_dim}"


KERNEL_PRESETS: dict[str, KernelShape] = {
    s.name: s
    for s in (
        KernelShape("flux-1024", 24, 4608, 128),
        KernelShape("image-8192-hd128", 24, 8192, 128),  # image lengths: Flux / QwenImage near 1.5 megapixels
        KernelShape("image-8192-hd64", 24, 8192, 64),  # SD3-style heads at the same length
        KernelShape("ltx-768x512x121", 32, 6144, 64),
        KernelShape("ltx-1216x704x257", 32, 27588, 64),
        KernelShape("wan-1.3b-480p", 12, 32760, 128),
        KernelShape("wan-14b-480p", 40, 32760, 128),
        KernelShape("wan-1.3b-720p", 12, 75600, 128),
        KernelShape("wan-14b-720p", 40, 75600, 128),
        KernelShape("tiny", 2, 256, 64),
    )
}


def parse_shape(text: str) -> KernelShape:
    try:
        h, s, d = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--shape takes H,S,D (three integers), not {text!r}") from None
    if min(h, s, d) <= 0:
        raise ValueError(f"--shape values must be positive: {text!r}")
    return KernelShape(f"custom-{h}x{s}x{d}", h, s, d)


def _inputs(shape: KernelShape, device: torch.device, dtype: torch.dtype, seed: int) -> AttentionInputs:
    gen = torch.Generator(device=device).manual_seed(seed)
    # B, S, H, D storage (diffusers' convention), handed over as B, H, S, D views
    q, k, v = (torch.randn(shape.batch, shape.seq, shape.heads, shape.head_dim, device=device, dtype=dtype,
                           generator=gen).transpose(1, 2) for _ in range(3))
    # named as a site, so that a form that keeps statistics from one call of a site to its next (fa3_fp8's carried
    # scales) is timed as a routed site runs it after its first call, and checked on fresh inputs with them
    return AttentionInputs(q, k, v, site=f"bench-kernels:{shape.name}")


def _reference(inputs: AttentionInputs) -> torch.Tensor:
    q, k, v = (t.float() for t in (inputs.query, inputs.key, inputs.value))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def bench_kernels(shapes: Sequence[KernelShape], form_names: Sequence[str] | None, device: torch.device,
                  dtype: torch.dtype, warm: int = 20, progress=None) -> list[BenchRow]:
    forms = create_forms(form_names)
    rows: list[BenchRow] = []
    for shape in shapes:
        group = shape.label
        timing_in = _inputs(shape, device, dtype, seed=1)
        check_in = _inputs(shape, device, dtype, seed=2)  # fresh inputs for the accuracy check
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        call = describe_call(timing_in.query, timing_in.key, timing_in.value, None, 0.0, False, False, capability)
        ref = None
        for name, form in forms.items():
            if progress:
                progress(f"{group}: {name}")
            reasons = form.not_supported_reasons(call)
            if reasons:
                status = "unavailable" if reasons[0].startswith("unavailable: ") else "unsupported"
                text = "; ".join(r.removeprefix("unavailable: ") for r in reasons)
                rows.append(BenchRow.not_run(group, name, "form", status, text))
                continue
            try:
                cold = time_once(lambda: form.run(timing_in), device)
                samples = warm_samples(lambda: form.run(timing_in), device, warm)
                if ref is None:
                    ref = _reference(check_in)
                acc = compare(form.run(check_in).float(), ref)
            except torch.cuda.OutOfMemoryError as exc:
                rows.append(BenchRow.not_run(group, name, "form", "out of memory", str(exc).split("\n")[0][:200]))
                torch.cuda.empty_cache()
                continue
            except Exception as exc:
                rows.append(BenchRow.not_run(group, name, "form", "raised", f"{type(exc).__name__}: {exc}"[:300]))
                continue
            med = statistics.median(samples)
            rows.append(BenchRow(group, name, "form", "ok", "", med, min(samples), max(samples), cold,
                                 shape.flops / (med * 1e-3) / 1e12, None, acc.cosine, acc.psnr_db, None))
            form.release()
        timed = [r for r in rows if r.group == group and r.warm_ms]
        base = next((r for r in timed if r.name == "sdpa_cudnn"), None) or (min(timed, key=lambda r: r.warm_ms)
                                                                           if timed else None)
        exact = [r for r in timed if forms[r.name].precision is Precision.EXACT]
        best_exact = min(exact, key=lambda r: r.warm_ms) if exact else None
        if base:
            for i, r in enumerate(rows):
                if r.group == group and r.warm_ms:
                    detail = f"ratio to {base.name}" + (
                        f"; {best_exact.warm_ms / r.warm_ms:.3f}x the best exact ({best_exact.name})"
                        if best_exact else "")
                    rows[i] = replace(r, ratio=base.warm_ms / r.warm_ms, detail=detail)
        del timing_in, check_in, ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows
