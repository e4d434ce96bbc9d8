"""eigen_adam: Adam in the eigenbasis of each block's averaged curvature (SOAP's idea on the spec's blocks).

Each block keeps the EMA A of its statistic Y Y^T / d and A's eigenbasis Q, refreshed every
`precondition_frequency` steps by eigh. Per step, on the block coordinates (mult x width; Q acts on the
multiplicity side, the side the group leaves free):

    u' = Q^T U,  g' = Q^T G                         (the momentum's and the statistic vector's coordinates)
    V <- adam_beta2 V + (1 - adam_beta2) g'^2        (Adam's second moment, in the eigenbasis)
    update = Q [ (u' / (1 - beta1^t)) / (sqrt(V / (1 - adam_beta2^t)) + eps) ]

With `geometric_mean_with=` a second spec the coordinates are rotated by every stage's basis in turn (rows by
one stage's Q, columns by the other's), Adam runs in the doubly rotated coordinates, and the result is rotated
back in reverse order: on a weight matrix with specs/shampoo_rows.toml and specs/shampoo_cols.toml this is SOAP
(Q_L^T G Q_R, Adam there, Q_L N' Q_R^T). With one Muon-style spec it is one-sided SOAP. Unlike SOAP's reference
code the first step is not skipped (its basis is the first statistic's), and directions whose eigenvalue is
zero to working precision get no update (see `rotation_basis`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...runtime.compiled import BlockInfo
from .base import (
    AdamOptions,
    AveragedOptions,
    BlockStep,
    Kind,
    StepContext,
    batched,
    finish,
    fold_statistic,
    refresh_due,
)


@dataclass
class EigenAdamConfig(AveragedOptions, AdamOptions):
    """Adam in the blocks' curvature eigenbasis (SOAP's defaults)."""

    kind: ClassVar[str] = "eigen_adam"
    statistic: str = "gradient"
    """The statistic and Adam's second moment are built from the raw gradient (SOAP), or the momentum."""
    precondition_frequency: int = 10
    """Refresh the eigenbasis every this many steps (SOAP: 10)."""
    geometric_mean_with: object = None
    """A second spec: rotate by both stages' bases (SOAP's two-sided Q_L, Q_R)."""


def rotation_basis(average: torch.Tensor) -> torch.Tensor:
    """The eigenvectors of a symmetric statistic (ascending eigenvalues), in float64, with the columns of
    eigenvalues that are zero to the statistic's precision set to zero. Those directions carry no gradient,
    only rounding noise, which Adam's normalisation would divide by eps (entries of noise / eps, as SOAP
    makes them on a rank-deficient first step); zero columns make the update there zero, Symo's
    pseudo-inverse convention."""
    evals, evecs = torch.linalg.eigh(average.to(torch.float64))
    lam = evals.amax(dim=-1, keepdim=True).clamp_min(0)
    keep = evals > lam * (8 * average.shape[-1] ** 0.5 * torch.finfo(average.dtype).eps)
    return evecs * keep.unsqueeze(-2)


class EigenAdam(Kind):
    name = "eigen_adam"
    update_scales = ("natural", "adamw")

    @property
    def carried(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("u", "g") if self.options.statistic == "gradient" else ("u",)

    def passes(self, n_stages: int) -> list[tuple[int, str]]:
        # in through every stage (Adam after the last one's rotation, then out of it), out through the others
        return [(k, "in") for k in range(n_stages)] + [(k, "out") for k in reversed(range(n_stages - 1))]

    def state_shapes(self, block: BlockInfo, stage: int, n_stages: int) -> dict[str, tuple[int, ...] | None]:
        m = (block.batch, block.mult, block.mult)
        shapes: dict[str, tuple[int, ...] | None] = {"step": None}
        if block.mult <= self.options.max_precond_dim:  # above the cap: Adam in the block's own coordinates
            shapes.update(ema=m, basis=m)
        if stage == n_stages - 1:
            shapes["exp_avg_sq"] = (block.batch, block.mult, block.width)
        return shapes

    def update(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        o = self.options
        for b in blocks:
            if b.plan.mult > o.max_precond_dim:
                b.state["step"] = b.state.get("step", 0) + 1
            else:
                b.scratch["average"] = fold_statistic(b.state, b.stat, b.plan.dim, o.beta2, ctx.stats_dtype)

    def due(self, stage: int, block: BlockStep) -> bool:
        return (block.plan.mult <= self.options.max_precond_dim
                and refresh_due(block.state, self.options.precondition_frequency, "basis"))

    def refresh(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        for b, q in zip(blocks, batched(rotation_basis, [b.scratch["average"] for b in blocks])):
            b.state["basis"] = q.to(ctx.stats_dtype)

    def apply(self, stage: int, direction: str, blocks: list[BlockStep], ctx: StepContext
              ) -> list[dict[str, torch.Tensor]]:
        out = []
        for b in blocks:
            q = b.state.get("basis")  # None above the size cap: the identity
            if direction == "out":
                y = b.coords["u"]
                out.append({"u": y if q is None else (q @ y.to(q.dtype)).to(y.dtype)})
                continue
            keys = list(b.coords)
            if q is None:
                rotated = {k: v.to(ctx.stats_dtype) for k, v in b.coords.items()}
            else:
                both = q.transpose(-1, -2) @ torch.cat([b.coords[k].to(q.dtype) for k in keys], dim=-1)
                rotated = dict(zip(keys, both.split([b.coords[k].shape[-1] for k in keys], dim=-1)))
            if stage < ctx.n_stages - 1:
                out.append({k: v.to(b.coords[k].dtype) for k, v in rotated.items()})
                continue
            n = self.adam(b, rotated["u"], rotated.get("g", rotated["u"]), ctx)
            y = b.coords["u"]
            cfg = self.config
            n = n if q is None else q @ n
            out.append({"u": finish(n.to(y.dtype), b.plan, cfg.update_scale, cfg.adamw_rms, 1.0)})
        return out

    def adam(self, b: BlockStep, u: torch.Tensor, g: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Adam's normalised step in the rotated coordinates (the second moment kept in the block's state)."""
        o, st = self.options, b.state
        t = st["step"]
        v = st.get("exp_avg_sq")
        v = torch.zeros_like(g) if v is None else v
        st["exp_avg_sq"] = v = v.mul(o.adam_beta2).addcmul(g, g, value=1 - o.adam_beta2)
        m_hat = u / (1 - ctx.beta1 ** t)
        return m_hat / ((v / (1 - o.adam_beta2 ** t)).sqrt() + o.eps)
