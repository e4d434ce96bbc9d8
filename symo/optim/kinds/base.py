"""The block-preconditioner interface: what one kind of preconditioner implements, and what the step hands it.

The step (optimizer.py) runs one loop. For each pass a kind asks for (`Kind.passes`), it gathers the
carried vectors into one stage's block coordinates, lets the kind act on every block, and scatters the
result back to parameter space. On a stage's first pass of a step the kind also folds this step's
statistics into each block's state (`update`) and refreshes the factors of the blocks that are due
(`refresh`), before `apply`. A kind declares the typed state it keeps per block (`state_shapes`), which
`state_dict` and torch.distributed.checkpoint save and `load_state_dict` checks.

Adding a kind: one file in this package with its config dataclass (only its own options, built from the
option groups below) and its `Kind` subclass, plus one line in `KINDS` (kinds/__init__.py). Its tests go
against a reference written in the test from the method's publication.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

import torch

from ...runtime.compiled import BlockInfo
from ...runtime.linalg import MUON_COEFFS, zero_threshold
from ..checks import check_types, raise_first
from ..plan import BlockPlan


# ------------------------------------------------------------------ option groups of the kind configs
@dataclass
class KindConfig:
    """Base of every kind's config. `kind` names the kind (not an option).

    A composing kind (then_orthogonalize) holds another kind's config in its field `inner`; that config's options
    are the composing kind's options too, reached by their own names (`option_names`, `holder`)."""

    kind: ClassVar[str] = ""
    inner_kinds: ClassVar[dict[str, Callable[[], KindConfig]]] = {}
    """A composing kind: {inner kind name: its default config}, for `inner="name"`."""

    def __post_init__(self) -> None:
        check_types(self)

    @property
    def composed(self) -> KindConfig | None:
        """The inner kind's config of a composing kind; None for a plain kind."""
        inner = getattr(self, "inner", None)
        return inner if isinstance(inner, KindConfig) else None

    def option_names(self) -> tuple[str, ...]:
        """Every option of this config: its own fields, then the inner kind's that it does not have itself."""
        own = tuple(f.name for f in fields(self))
        inner = self.composed
        return own if inner is None else own + tuple(n for n in inner.option_names() if n not in own)

    def holder(self, name: str) -> KindConfig | None:
        """The config that holds option `name` (this one, or the inner kind's); None if neither has it."""
        if name in {f.name for f in fields(self)}:
            return self
        inner = self.composed
        return None if inner is None else inner.holder(name)

    def option(self, name: str, default: Any = None) -> Any:
        """The value of option `name` wherever it is held, or `default` when the kind has no such option."""
        holder = self.holder(name)
        return default if holder is None else getattr(holder, name)


@dataclass
class StatisticOptions(KindConfig):
    """Which vector the block statistic Y Y^T / d is built from, and the dtype it is kept in."""

    statistic: Literal["momentum", "gradient"] = "momentum"
    """momentum: the vector that is preconditioned (u, as Muon does); gradient: the raw gradient."""
    stats_dtype: Literal["auto", "float64", "float32"] = "auto"
    """dtype of the statistics and their matrix functions. float64 keeps every direction the gradients
    hold (a float32 statistic knows its eigenvalues only to ~1e-7 lambda_max, and an undamped negative
    power must drop what lies below that). auto: float64, except on devices without float64 (mps)."""


@dataclass
class AveragedOptions(StatisticOptions):
    """A stored statistic: its EMA and the schedule on which its factors are refreshed."""

    beta2: float = 0.95
    """EMA of the block statistics, bias-corrected; 1: a plain running sum (AdaGrad / Shampoo); 0: the
    statistic of the step on which the factors are refreshed."""
    precondition_frequency: int = 1
    """Refresh the factors (matrix functions, eigenbases) every this many steps; the statistics update
    every step."""
    max_precond_dim: int = 2048
    """A block whose multiplicity exceeds this keeps only the diagonal of its statistic (SOAP's cap: a
    mult x mult matrix and its eigh grow as mult^2 and mult^3). The all-layers invariant block of a perm MLP
    spec (gpt_true: layers x (2 d_model + 1)) is the usual one."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (0.0 <= self.beta2 <= 1.0, f"beta2 must be in [0, 1], got {self.beta2}"),
            (self.precondition_frequency >= 1,
             f"precondition_frequency must be >= 1, got {self.precondition_frequency}"),
            (self.max_precond_dim >= 1, f"max_precond_dim must be >= 1, got {self.max_precond_dim}"),
        ])


@dataclass
class DampingOptions(KindConfig):
    """Damping of negative powers."""

    damping: float = 1e-6
    """Added before negative powers; see damping_mode."""
    damping_mode: Literal["relative", "absolute"] = "relative"
    """relative: x + damping * lambda_max per block, exact zeros stay zero (pseudo-inverse). absolute:
    x + damping on every eigenvalue (Shampoo's epsilon), eigenvalues that are zero to working precision
    still mapping to zero."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (self.damping >= 0.0 and math.isfinite(self.damping), f"damping must be >= 0, got {self.damping}"),
        ])


@dataclass
class PowerOptions(KindConfig):
    """The power of the curvature applied to u."""

    power: float = -0.5
    """Exponent of S applied to u: -1/2 is H^{-1} with H = S^{1/2} (Newton-like)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (self.power < 0.0, "power must be negative (it is applied to the curvature)"),
            (math.isfinite(self.power), f"power must be finite, got {self.power}"),
        ])


@dataclass
class NewtonSchulzOptions(KindConfig):
    """How a polar factor is computed (the Muon path and the last step of then_orthogonalize)."""

    backend: Literal["auto", "eigh", "newton_schulz"] = "auto"
    """newton_schulz: Muon's quintic iteration on Y; eigh: the exact polar factor through the smaller Gram
    side's eigendecomposition; auto: the quintic for blocks whose Gram side exceeds eigh_max_size, eigh
    elsewhere."""
    eigh_max_size: int = 128
    """auto backend: the largest Gram side solved by eigh."""
    ns_steps: int = 5
    """Newton–Schulz steps (Muon: 5)."""
    ns_coeffs: tuple[float, float, float] = MUON_COEFFS
    """Newton–Schulz coefficients (a, b, c): Muon's quintic; (1.5, -0.5, 0) is the exactly convergent cubic."""
    ns_dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision of the iterations (Muon runs them in bfloat16 on GPUs); input and output keep their dtype."""
    ns_method: Literal["auto", "iterate", "spectral"] = "auto"
    """iterate: the matrix-product iteration, as Muon runs it. spectral: the same polynomial map through one
    eigh of the smaller Gram (cheaper on CPU for large or wide blocks). auto: spectral on CPU when ns_dtype
    is float32 and linalg.spectral_ns_is_cheaper says so for the block's shape, iterate elsewhere."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (self.ns_method != "spectral" or self.ns_dtype == "float32",
             "ns_method='spectral' evaluates Newton-Schulz through a float32/float64 eigh; ns_dtype='bfloat16' "
             "applies to the iteration only: use ns_method='iterate' (or 'auto') with bfloat16"),
            (self.eigh_max_size >= 1, f"eigh_max_size must be >= 1, got {self.eigh_max_size}"),
            (self.ns_steps >= 1, f"ns_steps must be >= 1, got {self.ns_steps}"),
            (len(self.ns_coeffs) == 3 and all(math.isfinite(c) for c in self.ns_coeffs),
             f"ns_coeffs must be three finite numbers (a, b, c), got {self.ns_coeffs!r}"),
        ])


@dataclass
class AdamOptions(KindConfig):
    """Adam's second moment, taken in a block's eigenbasis."""

    adam_beta2: float = 0.95
    """EMA of the squared rotated coordinates (SOAP: 0.95)."""
    eps: float = 1e-8
    """Added to the root of the second moment (Adam's epsilon)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([
            (0.0 <= self.adam_beta2 < 1.0, f"adam_beta2 must be in [0, 1), got {self.adam_beta2}"),
            (self.eps >= 0.0 and math.isfinite(self.eps), f"eps must be a finite number >= 0, got {self.eps}"),
        ])


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

    def backend_for(self, block: BlockInfo, stage: int, device: torch.device, stats_dtype: torch.dtype) -> str:
        """The matrix-function backend of one block, decided at construction."""
        return "eigh"

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


def diagonal_power(diag: torch.Tensor, power: float, damping: float, absolute: bool) -> torch.Tensor:
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
