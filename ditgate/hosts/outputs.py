"""The prediction tensor of a denoiser's forward, whatever container the model returned it in."""

from __future__ import annotations

import torch


def model_output(result: object) -> torch.Tensor:
    if isinstance(result, torch.Tensor):
        return result
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], torch.Tensor):
        return result[0]
    sample = getattr(result, "sample", None)
    if isinstance(sample, torch.Tensor):
        return sample
    raise TypeError(f"cannot find the prediction tensor in a {type(result).__name__}")
