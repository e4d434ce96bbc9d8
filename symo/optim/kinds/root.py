"""root: the averaged curvature's power, A^{power} Y, with A the EMA (or running sum) of each block's
statistic Y Y^T / d. One-sided Shampoo on the spec's blocks with beta2 = 1; two-sided Shampoo
(L^{-1/4} G R^{-1/4}) with `geometric_mean_with=` a second spec, whose stage applies A2^{power/2} after the
first stage's A1^{power/2} (the two commute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from ...runtime.compiled import BlockInfo
from ...runtime.linalg import ns_inverse_root_min_damping
from ..checks import raise_first
from ..matrix_functions import stored_power
from .base import (
    AveragedOptions,
    BlockStep,
    DampingOptions,
    Kind,
    PowerOptions,
    RefreshOnChange,
    StepContext,
    batched,
    diagonal_power,
    finish,
    fold_statistic,
    refresh_due,
    statistic_shape,
    update_scale_factor,
)


@dataclass
class RootConfig(AveragedOptions, DampingOptions, PowerOptions):
    """A stored, averaged statistic A and its power A^{power} (-1/2: H^{-1} with H = A^{1/2})."""

    kind: ClassVar[str] = "root"
    geometric_mean_with: Any = None
    """A second spec whose curvature commutes with the first (specs/shampoo_cols.toml with
    specs/shampoo_rows.toml): each stage applies its own A^{power/2}, two-sided Shampoo L^{-1/4} G R^{-1/4}."""
    backend: Literal["auto", "eigh", "newton_schulz"] = "auto"
    """eigh (exact; float64 up to linalg.FLOAT64_EIGH_MAX), newton_schulz (the coupled inverse-root
    iteration, power -1/2 only, where its damping makes it accurate), or auto: the iteration only where it is
    both cheaper and accurate (an accelerator, a Gram side above eigh_max_size, relative damping at or above
    linalg.ns_inverse_root_min_damping); eigh elsewhere (on CPU eigh is cheaper at every size)."""
    eigh_max_size: int = 128
    ns_inverse_steps: int = 25
    """Coupled Newton–Schulz steps for A^{-1/2}."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (self.backend != "newton_schulz" or (self.power == -0.5 and self.geometric_mean_with is None),
             "the newton_schulz backend computes the -1/2 power only (power = -0.5, no geometric mean)"),
            (self.eigh_max_size >= 1, f"eigh_max_size must be >= 1, got {self.eigh_max_size}"),
            (self.ns_inverse_steps >= 1, f"ns_inverse_steps must be >= 1, got {self.ns_inverse_steps}"),
        ])


class Root(Kind):
    name = "root"

    def __init__(self, config, options=None) -> None:
        super().__init__(config, options)
        self.changes = RefreshOnChange()

    def stage_power(self, n_stages: int) -> float:
        return self.options.power / n_stages

    def backend_for(self, block: BlockInfo, stage: int, device: torch.device, stats_dtype: torch.dtype) -> str:
        o = self.options
        if o.backend != "auto":
            return o.backend
        large = (o.power == -0.5 and o.geometric_mean_with is None and block.mult > o.eigh_max_size
                 and device.type != "cpu" and o.damping_mode == "relative"
                 and o.damping >= ns_inverse_root_min_damping(o.ns_inverse_steps, stats_dtype))
        return "newton_schulz" if large else "eigh"

    def state_shapes(self, block: BlockInfo, stage: int, n_stages: int) -> dict[str, tuple[int, ...] | None]:
        stat = statistic_shape(block, self.options.max_precond_dim)
        shapes: dict[str, tuple[int, ...] | None] = {"step": None, "precond": stat}
        if self.options.beta2 > 0:
            shapes["ema"] = stat
        return shapes

    def update(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        o = self.options
        self.changes.check(stage, (self.stage_power(ctx.n_stages), o.damping, o.damping_mode))
        for b in blocks:
            b.scratch["average"] = fold_statistic(b.state, b.stat, b.plan.dim, o.beta2, ctx.stats_dtype,
                                                  diagonal=b.plan.mult > o.max_precond_dim)

    def due(self, stage: int, block: BlockStep) -> bool:
        return self.changes.due(stage) or refresh_due(block.state, self.options.precondition_frequency, "precond")

    def refresh(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        o = self.options
        power, absolute = self.stage_power(ctx.n_stages), o.damping_mode == "absolute"
        by_backend: dict[str, list[BlockStep]] = {}
        for b in blocks:
            if b.plan.mult > o.max_precond_dim:
                b.state["precond"] = diagonal_power(b.scratch["average"], power, o.damping, absolute)
                continue
            by_backend.setdefault(b.plan.backend, []).append(b)
        for backend, group in by_backend.items():
            where = group[0].plan.where if len(group) == 1 else f"{len(group)} blocks ({group[0].plan.where}, ...)"
            backend = "eigh" if o.backend == "eigh" else backend
            powers = batched(lambda a, backend=backend, where=where: stored_power(
                a, power=power, backend=backend, where=where, damping=o.damping, absolute=absolute,
                ns_inverse_steps=o.ns_inverse_steps), [b.scratch["average"] for b in group])
            for b, p in zip(group, powers):
                b.state["precond"] = p
        self.changes.refreshed(stage)

    def apply(self, stage: int, direction: str, blocks: list[BlockStep], ctx: StepContext
              ) -> list[dict[str, torch.Tensor]]:
        cfg, last = self.config, stage == ctx.n_stages - 1
        power = self.stage_power(ctx.n_stages)
        out = []
        for b in blocks:
            y, precond = b.coords["u"], b.state["precond"]
            diagonal = b.plan.mult > self.options.max_precond_dim
            z = ((precond * y.to(precond.dtype)) if diagonal else (precond @ y.to(precond.dtype))).to(y.dtype)
            scale = update_scale_factor(b.plan, self.update_scale, power, stage == 0)
            out.append({"u": finish(z, b.plan, self.update_scale if last else "natural", cfg.adamw_rms, scale)})
        return out
