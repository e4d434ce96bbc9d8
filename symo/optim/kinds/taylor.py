"""taylor: H = S_w^{-1} # S_g (the matrix geometric mean, the solution of H S_w H = S_g), with S_g the averaged
statistic and S_w = R2(w - R1(w)) of the current weights, per block; the update is H^{2 power} u. Trivial
(invariant) blocks, where S_w vanishes, use S_g^{power}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...runtime.compiled import BlockInfo
from ..matrix_functions import stored_power, taylor_power
from .base import (
    AveragedOptions,
    BlockStep,
    DampingOptions,
    Kind,
    PowerOptions,
    RefreshOnChange,
    StepContext,
    diagonal_power,
    finish,
    fold_diagonal,
    fold_statistic,
    refresh_due,
    statistic_shape,
    update_scale_factor,
)


@dataclass
class TaylorConfig(AveragedOptions, DampingOptions, PowerOptions):
    """The taylor estimator H = S_w^{-1} # S_g (S_w damped by `damping`, at least 1e-8 relative); the update
    is H^{2 power} u (power -1/2 applies H^{-1})."""

    kind: ClassVar[str] = "taylor"


class Taylor(Kind):
    name = "taylor"
    needs_weights = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self.changes = RefreshOnChange()

    def state_shapes(self, block: BlockInfo, stage: int, n_stages: int) -> dict[str, tuple[int, ...] | None]:
        stat = statistic_shape(block, self.options.max_precond_dim)
        shapes: dict[str, tuple[int, ...] | None] = {"step": None, "precond": stat}
        if self.options.beta2 > 0:
            shapes["ema"] = stat
        return shapes

    def update(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        o = self.options
        self.changes.check(stage, (o.power, o.damping, o.damping_mode))
        for b in blocks:
            fold = fold_diagonal if b.plan.mult > o.max_precond_dim else fold_statistic
            b.scratch["average"] = fold(b.state, b.stat, b.plan.dim, o.beta2, ctx.stats_dtype)

    def due(self, stage: int, block: BlockStep) -> bool:
        return self.changes.due(stage) or refresh_due(block.state, self.options.precondition_frequency, "precond")

    def refresh(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        o = self.options
        absolute = o.damping_mode == "absolute"
        for b in blocks:
            average = b.scratch["average"]
            if b.plan.mult > o.max_precond_dim:  # above the size cap: the diagonal of S_g, as root does
                b.state["precond"] = diagonal_power(average, o.power, o.damping, absolute)
                continue
            if b.plan.trivial:
                b.state["precond"] = stored_power(average, o.power, b.plan.backend, b.plan.where, o.damping, absolute)
                continue
            w = b.weight().to(average.dtype)
            sw = w @ w.transpose(-1, -2) / b.plan.dim
            b.state["precond"] = taylor_power(average, sw, o.power, o.damping, absolute)
        self.changes.refreshed(stage)

    def apply(self, stage: int, direction: str, blocks: list[BlockStep], ctx: StepContext
              ) -> list[dict[str, torch.Tensor]]:
        cfg, o = self.config, self.options
        out = []
        for b in blocks:
            y, precond = b.coords["u"], b.state["precond"]
            diagonal = b.plan.mult > o.max_precond_dim
            z = ((precond * y.to(precond.dtype)) if diagonal else (precond @ y.to(precond.dtype))).to(y.dtype)
            scale = update_scale_factor(b.plan, cfg.update_scale, o.power, True)
            out.append({"u": finish(z, b.plan, cfg.update_scale, cfg.adamw_rms, scale)})
        return out
