"""published: the orbit-averaged Taylor step as the method was published (the estimator of its Eq. 10, with
momentum). Per step, with m the momentum (m <- beta1 m + (1 - beta1) g) and t the step:

    m_hat = m / (1 - beta1_t),   beta1_t = max(beta1^t, 1e-4)            (the debiased momentum)
    S_g  <- beta2 S_g + (1 - beta2) R2(m_hat - R1(m_hat)),  S_g_hat = S_g / (1 - max(beta2^t, 1e-4))
    S_w   = R2(w - R1(w))                                                  (the current weights, not averaged)
    H_inv = P(S_w, 1/2) P(P(S_w, 1/2) S_g_hat P(S_w, 1/2), -1/2) P(S_w, 1/2)
    w    <- w - lr H_inv m                                                 (the momentum as it is, not debiased)

P(X, p) = U diag((d s_max + s)^p) U^T for X = U diag(+-s) U^T: every power damped by d times its own
matrix's largest |eigenvalue|, a zero raised to a negative power is 0, eigendecompositions in the statistics'
dtype (float64 in the preset; `stats_dtype="float32"` halves the step's time, and the damping keeps every
power's condition number below 1/d, well inside float32's precision).
H_inv is the inverse of H = S_w^{-1} # S_g, written so that S_w is never inverted: where the weights are
rank-deficient the step is damped, not blown up.

Where Symo's blocks differ from the method's dense matrices (docs/theory.md says more):
- `damping_scope="all"` (the published step): s_max is the largest |eigenvalue| of the whole matrix, over
  every block. Directions no block statistic reaches (parameters the group leaves fixed, where
  delta = x - R1(x) = 0, and the null space of S_w) then get H_inv = d s_w_max / sqrt(d s_inner_max) I: a
  plain momentum step about sqrt(d) times the others' scale. `damping_scope="block"`: s_max per block (each
  layer damped on its own scale), and the blocks the group leaves fixed use the uncentred statistics
  (delta = m_hat and w) instead, since their centred ones vanish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ...runtime.compiled import BlockInfo
from ..checks import raise_first
from ..divergence import DivergenceWatch
from .base import BlockStep, Kind, RefreshOnChange, StepContext, batched, finish, refresh_due, statistic_shape
from .options import StatisticOptions

DEBIAS_FLOOR = 1e-4  # beta^t stops decaying here in the bias corrections 1 - max(beta^t, DEBIAS_FLOOR)


@dataclass
class PublishedConfig(StatisticOptions):
    """The published step's options (its momentum is the optimizer's beta1: 0.9 in the published preset)."""

    kind: ClassVar[str] = "published"
    beta2: float = 0.99
    """EMA of the centred curvature statistic S_g (debiased)."""
    damping: float = 1e-4
    """d: each of the three powers is damped by d times its matrix's largest |eigenvalue|."""
    damping_scope: Literal["all", "block"] = "all"
    """all: s_max over the whole matrix (every block), as published; block: per block (see the module)."""
    precondition_frequency: int = 1
    """Recompute H_inv every this many steps (the statistics update every step); 1 is the published step."""
    max_precond_dim: int = 2048
    """A block whose multiplicity exceeds this keeps only the diagonals of S_g and S_w (H_inv elementwise)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (self.statistic == "momentum", "the published step builds its statistic from the debiased momentum; "
                                           "statistic='gradient' is not an option of it"),
            (0.0 <= self.beta2 < 1.0, f"beta2 must be in [0, 1), got {self.beta2}"),
            (self.damping > 0.0, f"damping must be > 0 (the published step damps every power), got {self.damping}"),
            (self.precondition_frequency >= 1,
             f"precondition_frequency must be >= 1, got {self.precondition_frequency}"),
        ])


def debias(beta: float, t: int) -> float:
    """1 - beta_t with beta_t = max(beta^t, DEBIAS_FLOOR): the published step's bias correction."""
    return 1.0 - max(beta ** t, DEBIAS_FLOOR)


def damped_power(evals: torch.Tensor, evecs: torch.Tensor | None, p: float, damping: float, s_max: torch.Tensor
                 ) -> torch.Tensor:
    """U diag((damping s_max + |lambda|)^p) U^T, with a zero to a negative power taken as 0; for a diagonal
    statistic (evecs None, evals (batch, mult, 1)) the diagonal of that."""
    f = damped(evals, p, damping * s_max)
    return f if evecs is None else (evecs * f.unsqueeze(-2)) @ evecs.transpose(-1, -2)


def damped(evals: torch.Tensor, p: float, eps: torch.Tensor) -> torch.Tensor:
    """(|lambda| + eps)^p elementwise, a zero to a negative power taken as 0."""
    s = evals.abs() + eps
    return s.pow(p) if p >= 0 else torch.where(s > 0, s.pow(p), torch.zeros_like(s))


def eigen(mats: list[torch.Tensor], diagonal: list[bool]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """eigh of each symmetric matrix (same-size ones batched); a diagonal one (batch, mult, 1) is its own."""
    full = batched(torch.linalg.eigh, [m for m, diag in zip(mats, diagonal) if not diag])
    it = iter(full)
    return [(m, None) if diag else next(it) for m, diag in zip(mats, diagonal)]


class HalfPower:
    """P(S_w, 1/2) = sqrt(eps) I + F diag(c) F^T for S_w = X X^T / dim (X: batch x mult x width), eps = d s_max.

    From the eigendecomposition of the smaller side: S_w = E diag(lam) E^T when width >= mult (F = E,
    c = sqrt(|lam| + eps) - sqrt(eps)); else the Gram X^T X / dim = V diag(lam) V^T, width x width, whose
    eigenvalues are S_w's nonzero ones, and F = X V, c = 1 / (dim (sqrt(|lam| + eps) + sqrt(eps))), since
    F diag(c) F^T = U diag(sqrt(lam + eps) - sqrt(eps)) U^T with U = X V / sqrt(dim lam): the same matrix with
    no division by a small eigenvalue. Held as a dense matrix where F is nearly square, else applied as the
    low-rank sum (`mul`), which costs 2 width / mult of a dense product.
    """

    def __init__(self, x: torch.Tensor, dim: int, evals: torch.Tensor, evecs: torch.Tensor, eps: torch.Tensor
                 ) -> None:
        mult, width = x.shape[-2], x.shape[-1]
        root = eps.sqrt().unsqueeze(-1)  # (batch, 1, 1)
        if width >= mult:  # S_w itself was decomposed
            f, c = evecs, damped(evals, 0.5, eps) - eps.sqrt()
        else:
            den = (damped(evals, 0.5, eps) + eps.sqrt()) * dim
            f, c = x @ evecs, torch.where(den > 0, 1 / den, torch.zeros_like(den))
        self.root, self.f, self.c = root, f, c
        self.dense = None
        if 5 * f.shape[-1] >= 3 * mult:  # three low-rank products would cost more than forming it once
            eye = torch.eye(mult, dtype=x.dtype, device=x.device)
            self.dense = root * eye + (f * c.unsqueeze(-2)) @ f.transpose(-1, -2)

    def mul(self, b: torch.Tensor) -> torch.Tensor:
        """P(S_w, 1/2) @ b."""
        if self.dense is not None:
            return self.dense @ b
        return self.root * b + self.f @ (self.c.unsqueeze(-1) * (self.f.transpose(-1, -2) @ b))


class Published(Kind):
    name = "published"
    needs_weights = True
    update_scales = ("natural", "adamw")
    debiases_momentum = True

    def __init__(self, config, options=None) -> None:
        super().__init__(config, options)
        self.changes = RefreshOnChange()
        self.watch = DivergenceWatch(self.name)  # warns once when the weights grow 10x within 10 steps

    def state_shapes(self, block: BlockInfo, stage: int, n_stages: int) -> dict[str, tuple[int, ...] | None]:
        m = statistic_shape(block, self.options.max_precond_dim)
        return {"step": None, "ema": m, "precond": m}

    def centred(self, b: BlockStep, coords: torch.Tensor) -> torch.Tensor:
        """delta = x - R1(x) in block coordinates: R1 is the identity on the trivial block and zero elsewhere."""
        if b.plan.trivial and self.options.damping_scope == "all":
            return torch.zeros_like(coords)
        return coords  # block scope: the fixed blocks keep their uncentred statistics

    def update(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        o = self.options
        self.changes.check(stage, (o.damping, o.damping_scope))
        for b in blocks:
            st = b.state
            st["step"] = t = st.get("step", 0) + 1
            delta = self.centred(b, b.coords["u"].to(ctx.stats_dtype) / debias(ctx.beta1, t))
            stat = self.second_moment(b, delta)
            ema = st.get("ema", torch.zeros_like(stat))
            st["ema"] = ema.mul(o.beta2).add(stat, alpha=1 - o.beta2)
        if blocks and blocks[0].weight is not None:
            self.watch.weights(max(b.state["step"] for b in blocks), {b.plan.id: b.weight() for b in blocks})

    def second_moment(self, b: BlockStep, x: torch.Tensor) -> torch.Tensor:
        """X X^T / d, or its diagonal above the size cap."""
        if b.plan.mult > self.options.max_precond_dim:
            return (x * x).sum(dim=-1, keepdim=True) / b.plan.dim
        return x @ x.transpose(-1, -2) / b.plan.dim

    def due(self, stage: int, block: BlockStep) -> bool:
        return self.changes.due(stage) or refresh_due(block.state, self.options.precondition_frequency, "precond")

    def refresh(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        """H_inv = h P(h S_g h, -1/2) h with h = P(S_w, 1/2), in the statistics' dtype (float64 in the preset).

        Two eigendecompositions per block: S_w's through its smaller side (`HalfPower`), and the inner matrix's,
        each batched over the blocks of one size; H_inv = (h E) diag(f) (h E)^T from the inner E diag(f) E^T."""
        o = self.options
        d, scope, dtype = o.damping, o.damping_scope, ctx.stats_dtype
        diagonal = [b.plan.mult > o.max_precond_dim for b in blocks]
        xs = [self.centred(b, b.weight().to(dtype)) for b in blocks]
        grams = [self.second_moment(b, x) if diag or x.shape[-1] >= x.shape[-2]
                 else x.transpose(-1, -2) @ x / b.plan.dim for b, x, diag in zip(blocks, xs, diagonal)]
        # a diagonal statistic is its own eigendecomposition: eigenvalues the entries, eigenvectors the identity
        w_eigs = eigen(grams, diagonal)
        w_max = self._s_max([e for e, _ in w_eigs], scope)
        halves: list[HalfPower | torch.Tensor] = [
            damped_power(e, u, 0.5, d, s) if diag else HalfPower(x, b.plan.dim, e, u, d * s)
            for b, x, (e, u), s, diag in zip(blocks, xs, w_eigs, w_max, diagonal)]
        sgs = [b.state["ema"].to(dtype) / debias(o.beta2, b.state["step"]) for b in blocks]
        inners = [h * sg * h if diag else h.mul(h.mul(sg).transpose(-1, -2))
                  for h, sg, diag in zip(halves, sgs, diagonal)]
        i_eigs = eigen(inners, diagonal)
        i_max = self._s_max([e for e, _ in i_eigs], scope)
        for b, h, (e, u), s, diag in zip(blocks, halves, i_eigs, i_max, diagonal):
            if diag:
                precond = h * damped_power(e, u, -0.5, d, s) * h
            else:
                he = h.mul(u)
                precond = (he * damped(e, -0.5, d * s).unsqueeze(-2)) @ he.transpose(-1, -2)
            b.state["precond"] = precond.to(ctx.stats_dtype)
        self.changes.refreshed(stage)

    @staticmethod
    def _s_max(evals: list[torch.Tensor], scope: str) -> list[torch.Tensor]:
        """Each block's damping reference: its own largest |eigenvalue| per batch element, or the largest
        over every block (the whole matrix) for scope "all"."""
        own = [e.abs().flatten(1).amax(dim=-1).reshape(-1, *([1] * (e.dim() - 1))) for e in evals]
        if scope == "block" or not own:
            return own
        top = torch.stack([x.amax() for x in own]).amax()
        return [torch.full_like(x, float(top)) for x in own]

    def apply(self, stage: int, direction: str, blocks: list[BlockStep], ctx: StepContext
              ) -> list[dict[str, torch.Tensor]]:
        cfg = self.config
        out = []
        for b in blocks:
            y, precond = b.coords["u"], b.state["precond"]
            diagonal = b.plan.mult > self.options.max_precond_dim
            z = ((precond * y.to(precond.dtype)) if diagonal else (precond @ y.to(precond.dtype))).to(y.dtype)
            out.append({"u": finish(z, b.plan, cfg.update_scale, cfg.adamw_rms, 1.0)})
        self.watch.updates({b.plan.id: o["u"] for b, o in zip(blocks, out)})
        return out
