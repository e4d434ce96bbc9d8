"""The block-preconditioner interface: what one kind of preconditioner implements, and what the step hands it.

The step (optimizer.py) runs one loop. For each pass a kind asks for (`Kind.passes`), it gathers the
carried vectors into one stage's block coordinates, lets the kind act on every block, and scatters the
result back to parameter space. On a stage's first pass of a step the kind also folds this step's
statistics into each block's state (`update`) and refreshes the factors of the blocks that are due
(`refresh`), before `apply`. A kind declares the typed state it keeps per block (`state_shapes`), which
`state_dict` and torch.distributed.checkpoint save and `load_state_dict` checks.

Adding a kind: one file in this package with its config dataclass (only its own options, built from the
option groups of kinds/options.py) and its `Kind` subclass, plus one line in `KINDS` (kinds/__init__.py). Its tests go
against a reference written in the test from the method's publication.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ...runtime.compiled import BlockInfo
from ...runtime.linalg import zero_threshold
from ..matrix_function_configs import Eigh, MatrixFunction
from ..plan import BlockPlan


# ------------------------------------------------------------------ what the step hands a kind
@dataclass
class StepContext:
    """What every block shares in one step."""

    stats_dtype: torch.dtype
    beta1: float
    """The momentum of the covered parameters (every covered group's beta1; kinds that debias the
    momentum need one value)."""
    n_stages: int
    device: torch.device
    statistics_only: bool = False
    """This step only builds the statistics and factors; the update is discarded (a kind that skips its first
    step, as SOAP does: `Kind.skips_first_step`)."""


@dataclass
class BlockStep:
    """One block in one pass of one step."""

    plan: BlockPlan
    state: dict[str, Any]
    """The block's persistent state (declared by `Kind.state_shapes`); {} for a stateless kind. Kinds assign
    new tensors to it and never write into the tensors it holds, so a step that raises can be undone."""
    coords: dict[str, torch.Tensor]
    """The carried vectors' coordinates (batch, mult, width): "u", the vector preconditioned, and the
    others the kind carries (`Kind.carried`)."""
    stat: torch.Tensor | None
    """On a stage's first pass: the coordinates of the vector the statistic is built from (the raw vector,
    never a transformed one); it is `coords["u"]` itself when that is the same vector."""
    weight: Callable[[], torch.Tensor] | None
    """The weights' coordinates, for kinds with `needs_weights`: a call, since gathering them costs a pass
    over the parameters and kinds need them only on the steps they refresh."""
    scratch: dict[str, Any] = field(default_factory=dict)
    """Per block and stage, kept across the passes of one step (a kind's values between its passes)."""


class Kind:
    """One kind of block preconditioner. One instance per optimizer; it reads its options from the optimizer's
    `config` at every step (so a change of `opt.config.power` or `opt.config.beta2` takes effect at once)."""

    name: ClassVar[str] = ""
    carried: ClassVar[tuple[str, ...]] = ("u",)
    needs_weights: ClassVar[bool] = False
    stateful: ClassVar[bool] = True
    update_scales: ClassVar[tuple[str, ...]] = ("natural", "muon", "adamw")
    """The update scales this kind's result has a meaning under (update_scale is refused otherwise)."""
    skips_first_step: bool = False
    """The optimizer's first step only builds this kind's statistics: no update, no weight decay, and the momentum
    starts at the second step (SOAP)."""
    debiases_momentum: bool = False
    """Whether this kind divides by the momentum's bias, 1 - beta1^t (Adam's step, the published step): it needs
    one beta1 for all covered groups, since a block may span several; the other kinds take beta1 per group."""

    def __init__(self, config: Any, options: Callable[[], Any] | None = None) -> None:
        self.config = config  # the optimizer's SymoConfig (its `preconditioner` is this kind's config)
        self._options = options  # a composed kind: its config, held by the composing kind's config

    @property
    def options(self) -> Any:
        return self.config.preconditioner if self._options is None else self._options()

    @property
    def update_scale(self) -> str:
        """The update-scale convention of this kind's result: the optimizer's, or natural for a composed kind
        (the composing kind applies the scale to its own result)."""
        return self.config.update_scale if self._options is None else "natural"

    # the stages, in order, that one step visits, each with a direction ("in", or a kind's own)
    def passes(self, n_stages: int) -> list[tuple[int, str]]:
        return [(k, "in") for k in range(n_stages)]

    def statistic_key(self) -> str:
        """The carried vector the statistic is built from: "u", or "g" for the raw gradient."""
        return "g" if getattr(self.options, "statistic", "momentum") == "gradient" else "u"

    def vectors(self) -> tuple[str, ...]:
        """The vectors the step must provide: the carried ones and the statistic's."""
        return tuple(dict.fromkeys((*self.carried, self.statistic_key())))

    def backend_for(self, block: BlockInfo, stage: int, device: torch.device, stats_dtype: torch.dtype
                    ) -> MatrixFunction:
        """The matrix function of one block (Eigh(), or the iteration config of the kind's backend), decided at
        construction: the block plan holds it."""
        return Eigh()

    def state_shapes(self, block: BlockInfo, stage: int, n_stages: int) -> dict[str, tuple[int, ...] | None]:
        """The block's persistent state: {key: tensor shape} (None: a plain number such as the step count)."""
        return {}

    def update(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        """Fold this step's statistics into each block's state."""

    def due(self, stage: int, block: BlockStep) -> bool:
        """Whether the block's factors are refreshed this step."""
        return False

    def refresh(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        """Recompute the factors of the due blocks (all of them at once, so same-size blocks batch)."""

    def apply(self, stage: int, direction: str, blocks: list[BlockStep], ctx: StepContext
              ) -> list[dict[str, torch.Tensor]]:
        """Each block's new coordinates of the carried vectors (the keys returned are carried on)."""
        raise NotImplementedError

    def after_step(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        """After every pass of the step: fold statistics that must not see this step's rotation (SOAP's order)."""

    def refuse_unsupported(self, n_stages: int) -> None:
        """Raise, at construction, for what this kind cannot do with `n_stages` stages (a message naming the
        option); the options themselves are checked by the kind's config."""


# ------------------------------------------------------------------ helpers shared by the kinds
def batched(fn: Callable[[torch.Tensor], Any], tensors: list[torch.Tensor]) -> list[Any]:
    """fn on each tensor (batch, ...), one call per group of equal shapes: the blocks of every layer stacked
    along the batch axis, since every matrix function here acts per batch element."""
    out: list[Any] = [None] * len(tensors)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((tuple(t.shape[1:]), t.dtype), []).append(i)
    for ids in groups.values():
        if len(ids) == 1:
            out[ids[0]] = fn(tensors[ids[0]])
            continue
        result = fn(torch.cat([tensors[i] for i in ids]))
        sizes = [tensors[i].shape[0] for i in ids]
        parts = [r.split(sizes) for r in result] if isinstance(result, tuple) else result.split(sizes)
        for j, i in enumerate(ids):
            out[i] = tuple(p[j] for p in parts) if isinstance(result, tuple) else parts[j]
    return out


def fold_statistic(state: dict[str, Any], coords: torch.Tensor, dim: int, beta2: float,
                   stats_dtype: torch.dtype, diagonal: bool = False) -> torch.Tensor:
    """Fold Y Y^T / d of this step (its diagonal, (batch, mult, 1), for a block above the size cap) into the
    block's EMA (state "ema", "step"); returns the bias-corrected average (with beta2 = 0: this step's
    statistic, which is not stored)."""
    y = coords.to(stats_dtype)
    stat = (y * y).sum(dim=-1, keepdim=True) / dim if diagonal else y @ y.transpose(-1, -2) / dim
    state["step"] = state.get("step", 0) + 1
    if beta2 == 0.0:
        return stat
    # a new tensor, never a write into the old one: a step that raises puts the old one back
    if "ema" not in state:
        state["ema"] = stat if beta2 == 1.0 else stat * (1 - beta2)
    elif beta2 == 1.0:
        state["ema"] = state["ema"].add(stat)
    else:
        state["ema"] = state["ema"].mul(beta2).add(stat, alpha=1 - beta2)
    return state["ema"] if beta2 == 1.0 else state["ema"] / (1 - beta2 ** state["step"])


def statistic_shape(block: BlockInfo | BlockPlan, cap: int) -> tuple[int, ...]:
    """The stored statistic of a block: mult x mult, or its diagonal (batch, mult, 1) above the cap."""
    return (block.batch, block.mult, 1) if block.mult > cap else (block.batch, block.mult, block.mult)


def diagonal_power(diag: torch.Tensor, *, power: float, damping: float, absolute: bool) -> torch.Tensor:
    """The power of a diagonal statistic (batch, mult, 1), with the conventions of linalg.spectral_fn: zeros
    to working precision map to zero, damping is relative to the block's largest entry (or absolute)."""
    lam = diag.amax(dim=-2, keepdim=True).clamp_min(0)
    keep = diag > zero_threshold(lam, diag.shape[-2], diag.dtype)
    shifted = torch.where(keep, diag + (damping if absolute else damping * lam), torch.ones_like(diag))
    return torch.where(keep, shifted.pow(power), torch.zeros_like(diag))


def refresh_due(state: dict[str, Any], frequency: int, factor: str) -> bool:
    """Factors are refreshed on the first step and every `frequency` steps after it."""
    return factor not in state or (state["step"] - 1) % frequency == 0


class RefreshOnChange:
    """Factors computed with options that a schedule may change (the power, the damping) are refreshed at the
    next step when those options change, even between scheduled refreshes."""

    def __init__(self) -> None:
        self.used: dict[int, tuple] = {}
        self.forced: set[int] = set()

    def check(self, stage: int, options: tuple) -> None:
        """Before a stage's update: note whether its factors were computed with other options."""
        if self.used.setdefault(stage, options) != options:
            self.forced.add(stage)
            self.used[stage] = options

    def due(self, stage: int) -> bool:
        return stage in self.forced

    def refreshed(self, stage: int) -> None:
        self.forced.discard(stage)


def update_scale_factor(plan: BlockPlan, update_scale: str, power: float, first: bool) -> float:
    """The update-scale convention's factor for one block and stage: natural 1; muon and adamw divide out the
    natural d^{-power}, and muon's first stage applies sqrt(max(1, width / mult)) (Muon's shape factor)."""
    if update_scale not in ("muon", "adamw"):
        return 1.0
    scale = plan.dim ** power
    if first and update_scale == "muon":
        scale *= math.sqrt(max(1.0, plan.width / plan.mult))
    return scale


def finish(z: torch.Tensor, plan: BlockPlan, update_scale: str, adamw_rms: float, scale: float) -> torch.Tensor:
    """The block's update scale, and for update_scale="adamw" the RMS matching to `adamw_rms`."""
    z = z * scale if scale != 1.0 else z
    if update_scale == "adamw":
        rms = z.norm(dim=(-2, -1), keepdim=True) / math.sqrt(plan.dof)
        z = z * (adamw_rms / rms.clamp_min(1e-30))
    return z
