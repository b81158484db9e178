"""The public verbs: attach a model or pipeline, explain, report, save, detach."""

from .plan import AlreadyAttachedError, Plan, attach
from .report import PlanReport, SiteRecord, SkippedModule

__all__ = ["AlreadyAttachedError", "Plan", "PlanReport", "SiteRecord", "SkippedModule", "attach"]
