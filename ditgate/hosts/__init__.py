"""Finding attention sites in diffusers models and intercepting their attention calls, per model."""

from .discovery import AttentionModule, find_attention_modules, role_hint
from .eager import EagerForward, uncompiled
from .intercept import (Convention, InterceptionPlan, disarm, is_routed, original_entry, plan_interception,
                        routed_processor)
from .outputs import model_output
from .pipeline import NoDenoiserError, denoisers_of

__all__ = [
    "AttentionModule",
    "Convention",
    "EagerForward",
    "InterceptionPlan",
    "NoDenoiserError",
    "denoisers_of",
    "disarm",
    "find_attention_modules",
    "is_routed",
    "model_output",
    "original_entry",
    "plan_interception",
    "role_hint",
    "routed_processor",
    "uncompiled",
]
