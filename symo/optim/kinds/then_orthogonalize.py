"""then_orthogonalize: precondition the momentum by the averaged curvature, then take its polar factor (the
variants that beat tuned Muon in public records). Per block of the spec:

    P = S^{-gamma} u          (inner="root": PMuon, polar(L^-gamma M R^-gamma) with geometric_mean_with=)
      or eigen_adam's step    (inner="eigen_adam": SOAP-Muon)
    P <- P ||u||_F / ||P||_F  (back to the momentum's norm, per block)
    update = sqrt(max(1, rows / cols)) polar(P)   by Newton–Schulz (Muon's scale), or exactly (backend="eigh")

The statistics are EMAs of the raw gradient's block statistics by default (PMuon's covariances).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar, Literal

import torch

from ...runtime.compiled import BlockInfo
from ..checks import raise_first
from ..matrix_functions import current_statistic_apply
from .base import (
    AveragedOptions,
    BlockStep,
    DampingOptions,
    Kind,
    NewtonSchulzOptions,
    StepContext,
    finish,
    update_scale_factor,
)
from .eigen_adam import EigenAdam, EigenAdamConfig
from .root import Root

DEFAULT_GAMMA, DEFAULT_ADAM_BETA2, DEFAULT_EPS = 0.3, 0.95, 1e-8


@dataclass
class ThenOrthogonalizeConfig(AveragedOptions, DampingOptions, NewtonSchulzOptions):
    """Precondition, then orthogonalize."""

    kind: ClassVar[str] = "then_orthogonalize"
    inner: Literal["root", "eigen_adam"] = "root"
    """root: S^{-gamma} of the averaged statistic (PMuon); eigen_adam: Adam in its eigenbasis (SOAP-Muon)."""
    gamma: float | None = None
    """inner="root": the power -gamma of each stage's statistic (default 0.3)."""
    adam_beta2: float | None = None
    """inner="eigen_adam": Adam's second-moment EMA (default 0.95)."""
    eps: float | None = None
    """inner="eigen_adam": Adam's epsilon (default 1e-8)."""
    statistic: str = "gradient"
    precondition_frequency: int = 10
    geometric_mean_with: object = None
    """A second spec: both sides preconditioned (PMuon's L^-gamma M R^-gamma; SOAP's Q_L, Q_R)."""
    two_sided: bool = False
    """inner="eigen_adam": both sides of each block rotated, from one spec (SOAP-Muon)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (self.inner in ("root", "eigen_adam"), f"inner must be 'root' or 'eigen_adam', got {self.inner!r}"),
            (self.inner == "root" or self.gamma is None,
             "gamma is the power of inner='root'; inner='eigen_adam' does not use it"),
            (self.inner == "eigen_adam" or not self.two_sided, "two_sided is an option of inner='eigen_adam'"),
            (self.inner == "eigen_adam" or (self.adam_beta2 is None and self.eps is None),
             "adam_beta2 and eps are options of inner='eigen_adam'; inner='root' does not use them"),
            (self.gamma is None or 0.0 < self.gamma <= 1.0, f"gamma must be in (0, 1], got {self.gamma}"),
            (self.adam_beta2 is None or 0.0 <= self.adam_beta2 < 1.0,
             f"adam_beta2 must be in [0, 1), got {self.adam_beta2}"),
        ])


class ThenOrthogonalize(Kind):
    name = "then_orthogonalize"
    update_scales = ("muon", "natural", "adamw")

    def __init__(self, config) -> None:
        super().__init__(config)
        self.inner = self._inner()

    def _inner(self) -> Kind:
        o = self.options
        view = SimpleNamespace(update_scale="natural", adamw_rms=1.0, batch_blocks=False)
        if o.inner == "root":
            view.preconditioner = SimpleNamespace(
                statistic=o.statistic, beta2=o.beta2, damping=o.damping, damping_mode=o.damping_mode,
                precondition_frequency=o.precondition_frequency, power=None, backend="eigh", eigh_max_size=0,
                ns_inverse_steps=1, geometric_mean_with=o.geometric_mean_with, max_precond_dim=o.max_precond_dim)
            return Root(view)
        view.preconditioner = EigenAdamConfig(
            statistic=o.statistic, beta2=o.beta2, precondition_frequency=o.precondition_frequency,
            adam_beta2=DEFAULT_ADAM_BETA2 if o.adam_beta2 is None else o.adam_beta2,
            eps=DEFAULT_EPS if o.eps is None else o.eps, geometric_mean_with=o.geometric_mean_with,
            max_precond_dim=o.max_precond_dim, two_sided=o.two_sided)
        return EigenAdam(view)

    def _sync(self, n_stages: int) -> None:
        """Options a schedule may change reach the inner kind at every step."""
        o, inner = self.options, self.inner.options
        inner.beta2, inner.precondition_frequency = o.beta2, o.precondition_frequency
        if self.options.inner == "root":
            inner.power = -(DEFAULT_GAMMA if o.gamma is None else o.gamma) * n_stages  # -gamma per stage
            inner.damping, inner.damping_mode = o.damping, o.damping_mode

    @property
    def carried(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.carried

    @property
    def skips_first_step(self) -> bool:  # type: ignore[override]
        return self.inner.skips_first_step

    def after_step(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        self.inner.after_step(stage, blocks, ctx)

    def passes(self, n_stages: int) -> list[tuple[int, str]]:
        inner = self.inner.passes(n_stages)
        return inner if inner[-1][0] == 0 else [*inner, (0, "polar")]

    def backend_for(self, block: BlockInfo, stage: int, device: torch.device, stats_dtype: torch.dtype) -> str:
        """The polar factor's backend (the inner statistics always use eigh)."""
        o = self.options
        if o.backend != "auto":
            return o.backend
        return "newton_schulz" if min(block.mult, block.width) > o.eigh_max_size else "eigh"

    def state_shapes(self, block: BlockInfo, stage: int, n_stages: int) -> dict[str, tuple[int, ...] | None]:
        return self.inner.state_shapes(block, stage, n_stages)

    def update(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        self._sync(ctx.n_stages)
        if stage == 0:
            for b in blocks:
                b.scratch["u_norm"] = b.coords["u"].norm(dim=(-2, -1), keepdim=True)
        self.inner.update(stage, blocks, ctx)

    def due(self, stage: int, block: BlockStep) -> bool:
        return self.inner.due(stage, block)

    def refresh(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        self.inner.refresh(stage, blocks, ctx)

    def apply(self, stage: int, direction: str, blocks: list[BlockStep], ctx: StepContext
              ) -> list[dict[str, torch.Tensor]]:
        if ctx.statistics_only:
            return self.inner.apply(stage, direction, blocks, ctx) if direction != "polar" else [
                {"u": b.coords["u"]} for b in blocks]
        passes = self.passes(ctx.n_stages)
        out = ([{"u": b.coords["u"]} for b in blocks] if direction == "polar"
               else self.inner.apply(stage, direction, blocks, ctx))
        if (stage, direction) != passes[-1]:
            return out
        o, cfg = self.options, self.config
        final = []
        for b, res in zip(blocks, out):
            p = res["u"]
            p = p * (b.scratch["u_norm"] / p.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-30)).to(p.dtype)
            z, extra = current_statistic_apply(p, p, b.plan, o, -0.5, 0.0, False, ctx.stats_dtype)
            scale = update_scale_factor(b.plan, cfg.update_scale, -0.5, True) * extra
            final.append({"u": finish(z, b.plan, cfg.update_scale, cfg.adamw_rms, scale)})
        return final
