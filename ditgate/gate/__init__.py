"""The gate: calibration on live calls, paired timing, accuracy floors, verdicts, receipts."""

from .accuracy import Accuracy, compare
from .chooser import GateChooser
from .env import environment
from .memory import MemoryUse, WorkspacePool, measure_memory
from .profiles import PROFILES, Profile, UnknownProfileError, resolve_profile
from .receipt import Receipt, ReceiptError, ReceiptMismatchError, load_receipt
from .timing import Timing, paired_timing
from .verdict import Measurement, Refusal, Verdict, WholeModelCheck
from .whole import whole_model_check

__all__ = [
    "PROFILES",
    "Accuracy",
    "GateChooser",
    "Measurement",
    "MemoryUse",
    "Profile",
    "Receipt",
    "ReceiptError",
    "ReceiptMismatchError",
    "Refusal",
    "Timing",
    "UnknownProfileError",
    "Verdict",
    "WholeModelCheck",
    "WorkspacePool",
    "compare",
    "environment",
    "load_receipt",
    "measure_memory",
    "paired_timing",
    "resolve_profile",
    "whole_model_check",
]
