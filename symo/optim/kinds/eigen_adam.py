"""eigen_adam: Adam in the eigenbasis of each block's averaged curvature; with `two_sided=True` SOAP itself
(Vyas et al. 2024) on every block of one spec. `preset="soap"` is the authors' algorithm with their defaults.

Each block keeps the EMA L of its statistic Y Y^T / d and L's eigenbasis Q_L (the multiplicity side, which the
group leaves free); `two_sided=True` also keeps the EMA R of Y^T Y and its eigenbasis Q_R (the side the group
moves: the other Kronecker factor, a relaxation of the group, which the orbit average would make I). On a
Muon-style spec a block's Y is one weight matrix's G^T, so Q_L and Q_R are SOAP's right and left bases. Per step,
on the block coordinates (mult x width), with the bases built from earlier gradients:

    u' = Q_L^T U Q_R,  g' = Q_L^T G Q_R               (the momentum's and the raw gradient's coordinates)
    V <- adam_beta2 V + (1 - adam_beta2) g'^2          (Adam's second moment, in the eigenbasis)
    update = Q_L [ sqrt(1 - adam_beta2^t) / (1 - beta1^t) * u' / (sqrt(V) + eps) ] Q_R^T
    then L, R <- beta2 EMA with this step's statistics; every precondition_frequency steps the bases are
    refreshed from the previous ones (`refresh`: one power iteration and QR, V following its column)

The first gradient only builds the statistics and the first bases (an eigh), and moves nothing; the momentum
starts at the second step. These are SOAP's conventions (the authors' code). The older ones stay as options,
each documented with its measured effect in docs/where_symmetry_helps.md: `first_step="update"`,
`statistic_timing="before"` (this step's statistic folded and its basis refreshed before the rotation),
`refresh=Eigh()` (a fresh eigendecomposition, V kept by position), `null_directions="drop"` (directions whose
eigenvalue is zero to the statistic's precision get no update) and `eps_placement="adam"` or "clamp".

With `geometric_mean_with=` a second spec the coordinates are rotated by every stage's basis in turn (rows by
one stage's Q, columns by the other's), Adam runs in the doubly rotated coordinates, and the result is rotated
back in reverse order; the first stage's refresh then cannot carry V (which lives in the last stage's
coordinates) and V stays by position there. `two_sided=True` on one spec is the same rotation without that
limit and without a second spec file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ...runtime.compiled import BlockInfo
from ...runtime.linalg import eigh_basis, power_qr_basis, zero_threshold
from ..checks import raise_first
from ..matrix_function_configs import BasisRefresh, Eigh, PowerQR
from .base import BlockStep, Kind, StepContext, batched, finish
from .options import AdamOptions, AveragedOptions

# a side of a block: (its statistic's state key, its basis's state key, the axis of V it rotates)
SIDES = (("ema", "basis", -2), ("ema_width", "basis_width", -1))


@dataclass
class EigenAdamConfig(AveragedOptions, AdamOptions):
    """Adam in the blocks' curvature eigenbasis, with SOAP's conventions (defaults: the authors')."""

    kind: ClassVar[str] = "eigen_adam"
    statistic: str = "gradient"
    """The statistic and Adam's second moment are built from the raw gradient (SOAP), or the momentum."""
    precondition_frequency: int = 10
    """Refresh the eigenbases every this many steps (SOAP: 10)."""
    max_precond_dim: int = 10000
    """A side larger than this is not rotated (its basis is the identity: SOAP's max_precond_dim)."""
    two_sided: bool = False
    """Also rotate each block's width side by the eigenbasis of Y^T Y: SOAP's two Kronecker factors from one spec."""
    refresh: BasisRefresh = PowerQR()
    """How a basis is refreshed after the first eigh: PowerQR(iterations=1) (SOAP) or Eigh() (a fresh eigh)."""
    first_step: Literal["skip", "update"] = "skip"
    """skip: the first gradient only builds the statistics and the bases (SOAP); update: it also takes a step."""
    statistic_timing: Literal["after", "before"] = "after"
    """after: the gradient is rotated by bases built from earlier gradients, and its statistic folded (and the
    bases refreshed when due) after the step (SOAP); before: folded and refreshed first."""
    null_directions: Literal["keep", "drop"] = "keep"
    """keep: every direction of the basis is updated (SOAP); drop: directions whose eigenvalue is zero to the
    statistic's precision (below 8 sqrt(n) eps lambda_max) get no update (needs refresh=Eigh())."""
    null_basis: Literal["eigh", "coordinates"] = "eigh"
    """eigh: the directions an eigendecomposition cannot tell apart at the statistic's precision (eigenvalue zero
    to it; after the first gradient most of a wide side's) keep the basis eigh gives them, which rounding decides
    (SOAP); coordinates: the orthonormal basis of their span nearest the parameter's coordinate axes, so that
    Adam meets new directions in its own coordinates and the first update is fixed by the weights."""
    refresh_phase: Literal["authors", "heavyball"] = "authors"
    """authors: refresh after steps 1 + k f (the authors' code); heavyball: after steps k f, one step earlier."""
    eps_placement: Literal["authors", "adam", "clamp"] = "authors"
    """authors: u' / (sqrt(V) + eps) times sqrt(1 - adam_beta2^t) / (1 - beta1^t) (SOAP's code); adam:
    m_hat / (sqrt(v_hat) + eps); clamp: m_hat / max(sqrt(v_hat), eps) (heavyball)."""
    geometric_mean_with: object = None
    """A second spec: rotate by both stages' bases (the two-spec form of two_sided)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (isinstance(self.refresh, (Eigh, PowerQR)),
             f"refresh must be symo.optim.PowerQR(...) or Eigh(), got {self.refresh!r}"),
            (self.null_directions == "keep" or isinstance(self.refresh, Eigh),
             "null_directions='drop' zeroes basis columns, which a power-iteration refresh cannot start from: "
             "pass refresh=symo.optim.Eigh() with it"),
            (not (self.two_sided and self.geometric_mean_with is not None),
             "two_sided=True takes the other side from the same spec; geometric_mean_with= takes it from a second "
             "spec: pass one of them"),
        ])


def first_basis(*, refresh: BasisRefresh, average: torch.Tensor, null_basis: str = "eigh") -> torch.Tensor:
    """A block's first basis under `refresh`: an eigh, in the column order its later refreshes keep."""
    return eigh_basis(average, descending=isinstance(refresh, PowerQR), null_basis=null_basis)


def next_basis(*, refresh: BasisRefresh, average: torch.Tensor, previous: torch.Tensor, null_basis: str = "eigh"
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The refreshed basis and, where its columns were reordered, their order (batch, n) (None: kept in place)."""
    if isinstance(refresh, PowerQR):
        return power_qr_basis(average, previous, iterations=refresh.iterations, lift=refresh.lift)
    return eigh_basis(average, descending=False, null_basis=null_basis), None


def drop_null_columns(basis: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
    """The basis with the columns whose eigenvalue (Q^T A Q's diagonal) is zero to the statistic's precision set
    to zero: they hold only rounding noise, which Adam's normalisation would divide by eps."""
    estimate = (basis * (average.to(basis.dtype) @ basis)).sum(dim=-2)
    lam = estimate.amax(dim=-1, keepdim=True).clamp_min(0)
    keep = estimate > zero_threshold(lam, average.shape[-1], average.dtype)
    return basis * keep.unsqueeze(-2)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b over the block's batch; one batch element (a whole weight matrix) as a plain 2-D product, which
    runs faster on CPU than the batched kernel."""
    return (a[0] @ b[0]).unsqueeze(0) if a.shape[0] == 1 and b.shape[0] == 1 else a @ b


def rotate(y: torch.Tensor, left: torch.Tensor | None, right: torch.Tensor | None, back: bool = False
           ) -> torch.Tensor:
    """Q_L^T Y Q_R (back: Q_L Y Q_R^T), a missing side the identity."""
    if left is not None:
        y = matmul(left if back else left.transpose(-1, -2), y)
    if right is not None:
        y = matmul(y, right.transpose(-1, -2) if back else right)
    return y


class EigenAdam(Kind):
    name = "eigen_adam"
    update_scales = ("natural", "adamw")
    debiases_momentum = True

    @property
    def carried(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("u", "g") if self.options.statistic == "gradient" else ("u",)

    @property
    def skips_first_step(self) -> bool:  # type: ignore[override]
        return self.options.first_step == "skip"

    def passes(self, n_stages: int) -> list[tuple[int, str]]:
        # in through every stage (Adam after the last one's rotation, then out of it), out through the others
        return [(k, "in") for k in range(n_stages)] + [(k, "out") for k in reversed(range(n_stages - 1))]

    def rotated_sides(self, mult: int, width: int) -> tuple[bool, bool]:
        """Whether the block's multiplicity side and width side are rotated (each at most max_precond_dim)."""
        o = self.options
        return mult <= o.max_precond_dim, o.two_sided and width <= o.max_precond_dim

    def state_shapes(self, block: BlockInfo, stage: int, n_stages: int) -> dict[str, tuple[int, ...] | None]:
        shapes: dict[str, tuple[int, ...] | None] = {"step": None}
        for (stat, basis, _), size, on in zip(SIDES, (block.mult, block.width),
                                              self.rotated_sides(block.mult, block.width)):
            if on:
                shapes.update({stat: (block.batch, size, size), basis: (block.batch, size, size)})
        if stage == n_stages - 1:
            shapes.update(exp_avg_sq=(block.batch, block.mult, block.width), adam_step=None)
        return shapes

    # ------------------------------------------------------------------ statistics and bases
    def fold(self, b: BlockStep, ctx: StepContext) -> None:
        """This step's statistics into the block's EMAs (not bias-corrected: a basis does not see the scale)."""
        beta2, y = self.options.beta2, b.stat.to(ctx.stats_dtype)
        for (key, _, axis), on in zip(SIDES, self.rotated_sides(b.plan.mult, b.plan.width)):
            if not on:
                continue
            stat = matmul(y, y.transpose(-1, -2)) if axis == -2 else matmul(y.transpose(-1, -2), y)
            old = b.state.get(key)
            if old is None or beta2 == 0.0:
                b.state[key] = stat if beta2 in (0.0, 1.0) else stat * (1 - beta2)
            else:  # a new tensor, never a write into the old one: a step that raises puts the old one back
                b.state[key] = old.add(stat) if beta2 == 1.0 else old.lerp(stat, 1 - beta2)
        b.scratch["folded"] = True

    def update(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        for b in blocks:
            b.state["step"] = b.state.get("step", 0) + 1
            if self.options.statistic_timing == "before" or b.state["step"] == 1:
                self.fold(b, ctx)

    def due(self, stage: int, block: BlockStep) -> bool:
        """Before the rotation: a block's first basis, or (statistic_timing="before") its scheduled refresh."""
        if "basis" not in block.state and "basis_width" not in block.state:
            return any(self.rotated_sides(block.plan.mult, block.plan.width))
        return (self.options.statistic_timing == "before"
                and (block.state["step"] - 1) % self.options.precondition_frequency == 0)

    def refresh(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        o = self.options
        for key, basis_key, axis in SIDES:
            side = [b for b in blocks if key in b.state]
            first = [b for b in side if basis_key not in b.state]
            firsts = batched(lambda a: first_basis(refresh=o.refresh, average=a, null_basis=o.null_basis),
                             [b.state[key] for b in first])
            for b, q in zip(first, firsts):
                b.state[basis_key] = self.kept(q, b.state[key])
            new = {id(b) for b in first}
            again = [b for b in side if id(b) not in new]
            pairs = [torch.stack((b.state[key], b.state[basis_key]), dim=1) for b in again]
            for b, (q, order) in zip(again, batched(self.refreshed, pairs)):
                b.state[basis_key] = self.kept(q, b.state[key])
                v = b.state.get("exp_avg_sq")
                if order is not None and v is not None:  # V follows its column (SOAP)
                    index = order.unsqueeze(-2 if axis == -1 else -1).expand_as(v)
                    b.state["exp_avg_sq"] = v.gather(axis, index)
            for b in side:
                b.scratch["refreshed"] = True

    def refreshed(self, pair: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch of (statistic, previous basis) pairs (batch, 2, n, n) -> (new basis, column order)."""
        o = self.options
        q, order = next_basis(refresh=o.refresh, average=pair[:, 0], previous=pair[:, 1], null_basis=o.null_basis)
        return q, (torch.arange(q.shape[-1], device=q.device).expand(q.shape[:-1]) if order is None else order)

    def kept(self, basis: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
        return drop_null_columns(basis, average) if self.options.null_directions == "drop" else basis

    def after_step(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        """statistic_timing="after": this step's statistic is folded once the step is taken, and the bases are
        refreshed on SOAP's schedule (after steps 1 + k precondition_frequency, k >= 1; refresh_phase="heavyball":
        after steps k precondition_frequency)."""
        o = self.options
        if o.statistic_timing != "after":
            return
        for b in blocks:
            if not b.scratch.get("folded"):
                self.fold(b, ctx)
        phase = 1 if o.refresh_phase == "authors" else 0
        due = [b for b in blocks if not b.scratch.get("refreshed") and b.state["step"] > 1
               and (b.state["step"] - phase) % o.precondition_frequency == 0]
        if due:
            self.refresh(stage, due, ctx)

    # ------------------------------------------------------------------ the step
    def apply(self, stage: int, direction: str, blocks: list[BlockStep], ctx: StepContext
              ) -> list[dict[str, torch.Tensor]]:
        if ctx.statistics_only:
            return [{k: torch.zeros_like(v) for k, v in b.coords.items()} for b in blocks]
        out = []
        for b in blocks:
            left, right = b.state.get("basis"), b.state.get("basis_width")
            if direction == "out":
                y = b.coords["u"]
                out.append({"u": y if left is None else (left @ y.to(left.dtype)).to(y.dtype)})
                continue
            rotated = {k: rotate(v.to(ctx.stats_dtype), left, right) for k, v in b.coords.items()}
            if stage < ctx.n_stages - 1:
                out.append({k: v.to(b.coords[k].dtype) for k, v in rotated.items()})
                continue
            n = rotate(self.adam(b, rotated["u"], rotated.get("g", rotated["u"]), ctx), left, right, back=True)
            cfg = self.config
            out.append({"u": finish(n.to(b.coords["u"].dtype), b.plan, self.update_scale, cfg.adamw_rms, 1.0)})
        return out

    def adam(self, b: BlockStep, u: torch.Tensor, g: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Adam's normalised step in the rotated coordinates (the second moment kept in the block's state)."""
        o, st = self.options, b.state
        t = st["adam_step"] = st.get("adam_step", 0) + 1
        v = st.get("exp_avg_sq")
        v = torch.zeros_like(g) if v is None else v
        st["exp_avg_sq"] = v = v.lerp(g * g, 1 - o.adam_beta2)
        debias1, debias2 = 1 - ctx.beta1 ** t, 1 - o.adam_beta2 ** t
        if o.eps_placement == "authors":
            return u * (math.sqrt(debias2) / debias1) / (v.sqrt() + o.eps)
        root = (v / debias2).sqrt()
        return (u / debias1) / (root + o.eps if o.eps_placement == "adam" else root.clamp_min(o.eps))
