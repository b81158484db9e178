"""Finding attention call sites in a diffusers model, by structure.

An attention module is anything that owns a callable ``processor`` (diffusers' ``Attention``, every
``AttentionModuleMixin``, and Mochi's ``MochiAttention``, which has no ``set_processor``: ditgate sets the
attribute itself); class names are never consulted. Its role is read
from what it projects: separate added key/value projections on equal lengths mean joint attention, a
module built for cross-attention (or a call whose key length differs) means cross, else self.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionModule:
    """One attention module of a model: its dotted path (prefixed by the component name) and role."""

    path: str
    module: torch.nn.Module
    role_hint: str


def role_hint(module: torch.nn.Module) -> str:
    if getattr(module, "is_cross_attention", False):
        return "cross"
    if getattr(module, "cross_attention_dim", None) not in (None, getattr(module, "query_dim", None)):
        # diffusers' Attention keeps cross_attention_dim == query_dim for self-attention
        return "cross"
    for name in ("add_k_proj", "add_q_proj"):
        if getattr(module, name, None) is not None:
            return "joint"
    return "self"


def find_attention_modules(model: torch.nn.Module, prefix: str = "") -> list[AttentionModule]:
    found = []
    for name, module in model.named_modules():
        if callable(getattr(module, "processor", None)):
            path = ".".join(p for p in (prefix, name) if p)
            found.append(AttentionModule(path=path, module=module, role_hint=role_hint(module)))
    return found
