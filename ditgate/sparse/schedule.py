"""Budgets per denoising step and per layer, and the step counter they are read from.

A ``BudgetSchedule`` says how much of the sparsifiable key tiles each layer keeps at each step (1.0 =
dense): typically dense for the first steps, whose coarse structure the whole picture depends on, and
for the first layers. ``StepCounter`` tells the step from what the denoiser is called with: diffusion
timesteps fall monotonically during one generation and repeat within a step (classifier-free guidance
calls the denoiser twice), so a timestep above the last one starts a new generation; a pipeline's denoisers
share one counter. It runs as a
forward pre-hook, outside the model's compiled region, so torch.compile graphs are not broken across
steps; it reads the timestep once per forward (one small device-to-host read).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BudgetSchedule:
    budget: float = 0.3
    dense_steps: int = 2  # the first steps of every generation run dense
    dense_layers: int = 1  # the first layers of every step run dense
    per_step: tuple[float, ...] | None = None  # explicit budgets by step (overrides ``budget`` there)

    def __post_init__(self) -> None:
        for b in (self.budget, *(self.per_step or ())):
            if not 0 < b <= 1:
                raise ValueError(f"budgets must lie in (0, 1], got {b}")
        if self.dense_steps < 0 or self.dense_layers < 0:
            raise ValueError("dense_steps and dense_layers must be >= 0")

    def budget_for(self, step: int, layer: int) -> float:
        if step < self.dense_steps or layer < self.dense_layers:
            return 1.0
        if self.per_step is not None and step < len(self.per_step):
            return self.per_step[step]
        return self.budget


class StepCounter:
    """Step index within the current generation, from the timesteps of the forwards it observes (one plan's
    denoisers share one: Wan 2.2's low-noise expert goes on from the steps its high-noise expert took).

    ``position``: where ``timestep`` comes among the forward's positional arguments, for a caller that passes
    it by position (``timestep_position`` reads it from the signature: second for Wan, third for LTX-Video and
    CogVideoX, fourth for Flux). Pipelines pass it by name, which is read first."""

    def __init__(self, position: int | None = 1) -> None:
        self.step = -1
        self.generation = 0
        self.position = position
        self._last: float | None = None

    def observe(self, timestep: object) -> int:
        # the largest of a tensor's: Wan 2.2's TI2V passes one timestep per token, 0 for the conditioning frame's
        t = float(timestep.max()) if isinstance(timestep, torch.Tensor) else float(timestep)
        if self._last is None or t > self._last:
            if self._last is not None:
                self.generation += 1
            self.step = 0
        elif t < self._last:
            self.step += 1
        self._last = t
        return self.step

    def hook(self, module, args, kwargs):
        """A forward pre-hook for a denoiser whose ``timestep`` comes at the counter's ``position``."""
        self.observe_call(args, kwargs, self.position)
        return None

    def observe_call(self, args: tuple, kwargs: dict, position: int | None) -> None:
        """Observe a forward's timestep: by name, else at ``position`` among its arguments (none: not counted)."""
        timestep = kwargs.get("timestep")
        if timestep is None and position is not None and len(args) > position:
            timestep = args[position]
        if timestep is None:
            return
        try:
            self.observe(timestep)
        except (TypeError, ValueError, RuntimeError):  # read in the host's forward, which it must never fail
            pass  # a timestep it cannot read (empty, not a number) leaves the step where it was


def timestep_position(model: torch.nn.Module) -> int | None:
    """Index of ``timestep`` among ``model.forward``'s positional parameters, or None where it has none."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return positional.index("timestep") if "timestep" in positional else None
