"""ditgate: measured, per-site attention routing for diffusion transformers in diffusers pipelines.

    import ditgate
    plan = ditgate.attach(pipe)      # every denoiser's attention now goes through ditgate
    out = pipe(...)                  # the first forward calibrates; later ones use the verdicts
    print(plan.explain())
    plan.detach()                    # the model is exactly as before
"""

__version__ = "0.1.0"

from .api import AlreadyAttachedError, Plan, PlanReport, attach  # noqa: E402
from .forms import UnknownFormError, describe_forms, known_form_names  # noqa: E402
from .gate import PROFILES, Profile, ReceiptError, ReceiptMismatchError, load_receipt  # noqa: E402
from .gate.linear import LinearSetting  # noqa: E402
from .sparse.schedule import BudgetSchedule  # noqa: E402
from .sparse.stage import SparseSetting  # noqa: E402

__all__ = [
    "PROFILES",
    "AlreadyAttachedError",
    "BudgetSchedule",
    "LinearSetting",
    "Plan",
    "SparseSetting",
    "PlanReport",
    "Profile",
    "ReceiptError",
    "ReceiptMismatchError",
    "UnknownFormError",
    "__version__",
    "attach",
    "describe_forms",
    "known_form_names",
    "load_receipt",
]
