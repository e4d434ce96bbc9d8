"""then_orthogonalize: precondition the momentum by another kind, then take its polar factor (the variants that beat
tuned Muon in public records). Per block of the spec:

    P = the inner kind's result on u    (inner="root": S^{power} u, PMuon; with geometric_mean_with= a second spec
                                         polar(L^{power/2} M R^{power/2}); inner="eigen_adam": SOAP's direction,
                                         SOAP-Muon, both sides from one spec with two_sided=True)
    P <- P ||u||_F / ||P||_F            (back to the momentum's norm, per block)
    O = polar(P)                          by Newton–Schulz, or exactly (backend="eigh")
    O <- Q_L [sign(o') |o'|^p] Q_R^T      (eigenbasis_power=p != 1, inner="eigen_adam": each entry o' of O's
                                          coordinates in the inner kind's eigenbases, then rescaled to O's norm)
    update = sqrt(max(1, rows / cols)) O  (Muon's scale)

The config holds the inner kind's own config (`inner`, a RootConfig or an EigenAdamConfig); its options are this
kind's options too, reached by their names (`Symo(..., preset="then_orthogonalize", power=-0.5)` sets the inner
root's power), and checked once by that config. The default inner is PMuon's: the power -0.3 of an EMA (0.95) of
the raw gradient's block statistics, by eigh, refreshed every 10 steps. `eigenbasis_power=0.5` is the signed square
root that the SOAP authors' own SOAP-Muon code takes of the polar factor in SOAP's eigenbasis, after which the
update is no longer orthogonal: it leans towards the sign of the eigenbasis coordinates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ...runtime.compiled import BlockInfo
from ..checks import raise_first
from ..matrix_function_configs import Auto, Eigh, MatrixFunction
from ..matrix_functions import current_statistic_apply
from .base import BlockStep, Kind, StepContext, finish, update_scale_factor
from .eigen_adam import EigenAdam, EigenAdamConfig, rotate
from .options import KindConfig, PolarFactorOptions
from .root import Root, RootConfig


def pmuon_root() -> RootConfig:
    """PMuon's inner step: S^{-0.3} of an EMA (0.95) of the raw gradient's statistics, by eigh, every 10 steps."""
    return RootConfig(statistic="gradient", precondition_frequency=10, power=-0.3, backend="eigh")


@dataclass
class ThenOrthogonalizeConfig(PolarFactorOptions):
    """Precondition by the inner kind, then orthogonalize (`backend` and its flat keywords eigh_max_size, ns_* are the
    polar factor's: PolarFactorOptions)."""

    kind: ClassVar[str] = "then_orthogonalize"
    inner_kinds: ClassVar[dict] = {"root": pmuon_root, "eigen_adam": EigenAdamConfig}
    inner: KindConfig = field(default_factory=pmuon_root)
    """The inner kind's config: RootConfig (PMuon; default `pmuon_root()`) or EigenAdamConfig (SOAP-Muon); or its
    name, "root" or "eigen_adam", for that kind's default."""
    eigenbasis_power: float = 1.0
    """With inner="eigen_adam" on one spec: each coordinate o' of the polar factor in the inner kind's eigenbases
    becomes sign(o') |o'|^p, rescaled to the polar factor's Frobenius norm. 1 (default): the polar factor itself;
    0.5: the SOAP authors' SOAP-Muon code."""

    def __post_init__(self) -> None:
        if isinstance(self.inner, str) and self.inner in self.inner_kinds:
            self.inner = self.inner_kinds[self.inner]()
        super().__post_init__()
        raise_first([
            (isinstance(self.inner, (RootConfig, EigenAdamConfig)),
             f"inner must be 'root', 'eigen_adam', a RootConfig or an EigenAdamConfig, got {self.inner!r}"),
            (not isinstance(self.inner, RootConfig) or isinstance(self.inner.backend, Eigh),
             "inner: then_orthogonalize's inner root takes its power by eigh (backend='eigh'); the backend option "
             "of then_orthogonalize is the polar factor's"),
            (math.isfinite(self.eigenbasis_power) and 0 < self.eigenbasis_power <= 1,
             f"eigenbasis_power must be in (0, 1] (0.5: the SOAP authors' SOAP-Muon), got {self.eigenbasis_power!r}"),
            (self.eigenbasis_power == 1 or (isinstance(self.inner, EigenAdamConfig)
                                            and self.inner.geometric_mean_with is None),
             "eigenbasis_power acts in the eigenbases of inner='eigen_adam' on one spec (two_sided=True for both "
             "sides); with another inner, or geometric_mean_with=, leave it at 1"),
        ])


class ThenOrthogonalize(Kind):
    name = "then_orthogonalize"
    update_scales = ("muon", "natural", "adamw")

    def __init__(self, config, options=None) -> None:
        super().__init__(config, options)
        inner_kind = {RootConfig: Root, EigenAdamConfig: EigenAdam}[type(self.options.inner)]
        self.inner: Kind = inner_kind(config, lambda: self.options.inner)

    def statistic_key(self) -> str:
        return self.inner.statistic_key()

    @property
    def carried(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.carried

    @property
    def skips_first_step(self) -> bool:  # type: ignore[override]
        return self.inner.skips_first_step

    @property
    def debiases_momentum(self) -> bool:  # type: ignore[override]
        return self.inner.debiases_momentum

    def after_step(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        self.inner.after_step(stage, blocks, ctx)

    def passes(self, n_stages: int) -> list[tuple[int, str]]:
        inner = self.inner.passes(n_stages)
        return inner if inner[-1][0] == 0 else [*inner, (0, "polar")]

    def backend_for(self, block: BlockInfo, stage: int, device: torch.device, stats_dtype: torch.dtype
                    ) -> MatrixFunction:
        """The polar factor's matrix function (the inner statistics always use eigh)."""
        o = self.options
        if not isinstance(o.backend, Auto):
            return o.backend
        return o.backend.iteration if min(block.mult, block.width) > o.backend.eigh_max_size else Eigh()

    def state_shapes(self, block: BlockInfo, stage: int, n_stages: int) -> dict[str, tuple[int, ...] | None]:
        return self.inner.state_shapes(block, stage, n_stages)

    def update(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
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
        cfg = self.config
        final = []
        for b, res in zip(blocks, out):
            p = res["u"]
            p = p * (b.scratch["u_norm"] / p.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-30)).to(p.dtype)
            z, extra = current_statistic_apply(p, statistic=p, plan=b.plan, power=-0.5, damping=0.0, absolute=False,
                                               stats_dtype=ctx.stats_dtype)
            if self.options.eigenbasis_power != 1:
                z = self.signed_power_in_eigenbasis(z, b, ctx)
            scale = update_scale_factor(b.plan, self.update_scale, -0.5, True) * extra
            final.append({"u": finish(z, b.plan, self.update_scale, cfg.adamw_rms, scale)})
        return final

    def signed_power_in_eigenbasis(self, z: torch.Tensor, b: BlockStep, ctx: StepContext) -> torch.Tensor:
        """sign(o') |o'|^p of z's coordinates o' in the block's eigenbases (a side without one: the identity), rotated
        back and rescaled to z's Frobenius norm."""
        left, right = b.state.get("basis"), b.state.get("basis_width")
        o = rotate(z.to(ctx.stats_dtype), left, right)
        o = o.sign() * o.abs().pow(self.options.eigenbasis_power)
        o = o * (z.norm(dim=(-2, -1), keepdim=True).to(o.dtype) / o.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-30))
        return rotate(o, left, right, back=True).to(z.dtype)
