"""The environment a verdict was measured in: GPU, capability, and every relevant package version."""

from __future__ import annotations

import importlib.metadata
import platform

import torch

PACKAGES = ("torch", "diffusers", "triton", "flash-attn-4", "fa3-fwd", "sageattention", "nvidia-cutlass-dsl")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(device: torch.device | str | None = None) -> dict:
    device = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    env: dict = {"device_type": device.type, "python": platform.python_version()}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        env["gpu"] = torch.cuda.get_device_name(index)
        env["capability"] = list(torch.cuda.get_device_capability(index))
        env["cuda"] = torch.version.cuda
    else:
        env["gpu"] = None
        env["cpu"] = platform.processor() or platform.machine()
    from .. import __version__

    # ditgate's own version from the package, also when it runs from a source tree pip never installed
    env["packages"] = {"ditgate": __version__, **{p: _version(p) for p in PACKAGES}}
    return env


def differences(recorded: dict, current: dict, prefix: str = "") -> list[str]:
    """Human-readable differences between two environments (``python`` is ignored: it does not time kernels)."""
    out = []
    for key in sorted(set(recorded) | set(current)):
        if key == "python":
            continue
        a, b = recorded.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: receipt {a!r}, here {b!r}")
    return out
