"""Declarative attention forms: what each serves, whether it is installed, and the call itself."""

from .base import (
    AttentionCall,
    AttentionInputs,
    Availability,
    Form,
    FormInfo,
    FormSpec,
    MaskKind,
    Precision,
    describe_call,
    spec_reasons,
)
from .registry import (
    BOUNDED_PRIORITY,
    SPARSE_PRIORITY,
    EXACT_PRIORITY,
    UnknownFormError,
    check_form_names,
    create_forms,
    describe_forms,
    form_info,
    known_form_names,
)

__all__ = [
    "AttentionCall",
    "AttentionInputs",
    "Availability",
    "BOUNDED_PRIORITY",
    "SPARSE_PRIORITY",
    "EXACT_PRIORITY",
    "Form",
    "FormInfo",
    "FormSpec",
    "MaskKind",
    "Precision",
    "UnknownFormError",
    "check_form_names",
    "create_forms",
    "describe_call",
    "describe_forms",
    "form_info",
    "known_form_names",
    "spec_reasons",
]
