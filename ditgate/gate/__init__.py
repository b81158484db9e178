"""The gate: calibration on live calls, paired timing, accuracy floors, verdicts, receipts."""

from .accuracy import Accuracy, compare
from .book import BookTiming, TimingBook, TimingKey
from .cache import TimingCache, default_cache_path
from .chooser import GateChooser
from .contest import ContestResult, Entrant, contest
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
    "BookTiming",
    "ContestResult",
    "Entrant",
    "GateChooser",
    "Measurement",
    "MemoryUse",
    "Profile",
    "Receipt",
    "ReceiptError",
    "ReceiptMismatchError",
    "Refusal",
    "Timing",
    "TimingBook",
    "TimingCache",
    "TimingKey",
    "UnknownProfileError",
    "Verdict",
    "WholeModelCheck",
    "WorkspacePool",
    "compare",
    "contest",
    "default_cache_path",
    "environment",
    "load_receipt",
    "measure_memory",
    "paired_timing",
    "resolve_profile",
    "whole_model_check",
]
