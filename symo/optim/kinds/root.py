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
from ..matrix_function_configs import Auto, CoupledNewton, Eigh, MatrixFunction
from ..matrix_functions import stored_power
from .base import (
    BlockStep,
    Kind,
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
from .options import AveragedOptions, DampingOptions, PowerOptions


@dataclass
class RootConfig(AveragedOptions, DampingOptions, PowerOptions):
    """A stored, averaged statistic A and its power A^{power} (-1/2: H^{-1} with H = A^{1/2})."""

    kind: ClassVar[str] = "root"
    geometric_mean_with: Any = None
    """A second spec whose curvature commutes with the first (specs/shampoo_cols.toml with
    specs/shampoo_rows.toml): each stage applies its own A^{power/2}, two-sided Shampoo L^{-1/4} G R^{-1/4}."""
    backend: Auto | Eigh | CoupledNewton | Literal["auto", "eigh", "newton_schulz"] = Auto()
    """Eigh() (exact; float64 up to linalg.FLOAT64_EIGH_MAX), CoupledNewton(steps=25) (the coupled inverse-root
    iteration, power -1/2 only, where its damping makes it accurate), or Auto(eigh_max_size=128): the iteration
    only where it is both cheaper and accurate (an accelerator, a Gram side above eigh_max_size, relative damping at
    or above linalg.ns_inverse_root_min_damping); eigh elsewhere (on CPU eigh is cheaper at every size). The strings
    "eigh", "newton_schulz", "auto" spell these; the flat keywords eigh_max_size and ns_inverse_steps (the
    iteration's steps) set their fields."""
    matrix_functions: ClassVar[dict[str, type]] = {"backend": CoupledNewton}
    shortcuts: ClassVar[dict[str, tuple[str, type, str]]] = {
        "eigh_max_size": ("backend", Auto, "eigh_max_size"), "ns_inverse_steps": ("backend", CoupledNewton, "steps")}

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (not isinstance(self.backend, CoupledNewton)
             or (self.power == -0.5 and self.geometric_mean_with is None),
             "the newton_schulz backend computes the -1/2 power only (power = -0.5, no geometric mean)"),
        ])


class Root(Kind):
    name = "root"

    def __init__(self, config, options=None) -> None:
        super().__init__(config, options)
        self.changes = RefreshOnChange()

    def stage_power(self, n_stages: int) -> float:
        return self.options.power / n_stages

    def backend_for(self, block: BlockInfo, stage: int, device: torch.device, stats_dtype: torch.dtype
                    ) -> MatrixFunction:
        o = self.options
        if not isinstance(o.backend, Auto):
            return o.backend
        iteration = o.backend.iteration
        large = (o.power == -0.5 and o.geometric_mean_with is None and block.mult > o.backend.eigh_max_size
                 and device.type != "cpu" and o.damping_mode == "relative"
                 and o.damping >= ns_inverse_root_min_damping(iteration.steps, stats_dtype))
        return iteration if large else Eigh()

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
        by_backend: dict[MatrixFunction, list[BlockStep]] = {}
        for b in blocks:
            if b.plan.mult > o.max_precond_dim:
                b.state["precond"] = diagonal_power(b.scratch["average"], power=power, damping=o.damping,
                                                    absolute=absolute)
                continue
            # a composing kind's plan holds its own matrix function (then_orthogonalize's polar factor): an inner
            # root takes Eigh()
            by_backend.setdefault(Eigh() if isinstance(o.backend, Eigh) else b.plan.backend, []).append(b)
        for method, group in by_backend.items():
            where = group[0].plan.where if len(group) == 1 else f"{len(group)} blocks ({group[0].plan.where}, ...)"
            powers = batched(lambda a, method=method, where=where: stored_power(
                a, power=power, method=method, where=where, damping=o.damping, absolute=absolute),
                [b.scratch["average"] for b in group])
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
