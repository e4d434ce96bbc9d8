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
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal

import torch

from ...runtime.compiled import BlockInfo
from ...runtime.linalg import zero_threshold
from ..checks import check_types, raise_first
from ..matrix_function_configs import Auto, Eigh, MatrixFunction, NewtonSchulz, iteration_of, spelled
from ..plan import BlockPlan


def _holding(value: object, config: type) -> MatrixFunction | None:
    """The config of class `config` that a matrix-function field's value holds: the value itself or its Auto's
    iteration; None when it holds none (ns_steps against Eigh())."""
    if isinstance(value, config):
        return value
    held = iteration_of(value) if isinstance(value, MatrixFunction) else None
    return held if isinstance(held, config) else None


# ------------------------------------------------------------------ option groups of the kind configs
@dataclass
class KindConfig:
    """Base of every kind's config. `kind` names the kind (not an option).

    A composing kind (then_orthogonalize) holds another kind's config in its field `inner`; that config's options
    are the composing kind's options too, reached by their own names (`option_names`, `holder`)."""

    kind: ClassVar[str] = ""
    inner_kinds: ClassVar[dict[str, Callable[[], KindConfig]]] = {}
    """A composing kind: {inner kind name: its default config}, for `inner="name"`."""
    matrix_functions: ClassVar[dict[str, type]] = {}
    """The fields that hold a matrix function (symo.optim.matrix_function_configs) and the iteration each field's
    string spelling "newton_schulz" (and "auto") stands for: {"backend": NewtonSchulz} for a polar factor."""
    shortcuts: ClassVar[dict[str, tuple[str, type, str]]] = {}
    """Flat keywords for one field of a matrix-function config this kind holds: {keyword: (the kind's field, the
    config class, that class's field)}, e.g. ns_steps -> ("backend", NewtonSchulz, "steps"). They are read and set
    like options (`Symo(..., ns_steps=3)`, `cfg.ns_steps`); a shortcut whose config the field does not hold (ns_steps
    with backend=Eigh()) is checked and sets nothing, and reads that config's default. This table is the one place
    where the flat keywords are mapped."""

    def __post_init__(self) -> None:
        for name, iteration in self.matrix_functions.items():
            setattr(self, name, spelled(getattr(self, name), iteration))
        check_types(self)
        for name, iteration in self.matrix_functions.items():
            held = iteration_of(getattr(self, name))
            raise_first([(held is None or isinstance(held, iteration),
                          f"{name}={getattr(self, name)!r}: preconditioner {self.kind!r} iterates with "
                          f"{iteration.__name__}(...), not {type(held).__name__}; pass {iteration.__name__}(...), "
                          f"Auto(iteration={iteration.__name__}(...)) or Auto()")])

    def __getattr__(self, name: str) -> Any:  # only for names that are not attributes: the shortcuts
        shortcut = type(self).shortcuts.get(name)
        if shortcut is None or shortcut[0] not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        held, config, attribute = shortcut
        target = _holding(self.__dict__[held], config)
        return getattr(config() if target is None else target, attribute)

    @classmethod
    def own_options(cls) -> tuple[str, ...]:
        """This kind's own options: its fields, each followed by its shortcuts."""
        return tuple(n for f in fields(cls)
                     for n in (f.name, *(k for k, (held, _, _) in cls.shortcuts.items() if held == f.name)))

    def with_options(self, changes: dict[str, Any]) -> KindConfig:
        """A copy with `changes` to its own options (fields and shortcuts) applied and checked. A string spelling of
        a matrix function keeps the settings of the config it replaces (`backend="auto"` after ns_steps=3 keeps 3);
        the shortcuts apply after the fields."""
        own = {k: (spelled(v, self.matrix_functions[k], getattr(self, k)) if k in self.matrix_functions else v)
               for k, v in changes.items() if k not in self.shortcuts}
        out = replace(self, **own)
        grouped: dict[tuple[str, type], dict[str, tuple[str, Any]]] = {}
        for name, value in changes.items():
            if name in self.shortcuts:
                held, config, attribute = self.shortcuts[name]
                grouped.setdefault((held, config), {})[attribute] = (name, value)
        updates: dict[str, Any] = {}
        for (held, config), values in grouped.items():
            current = updates.get(held, getattr(out, held))
            target = _holding(current, config)
            try:
                made = replace(config() if target is None else target, **{a: v for a, (_, v) in values.items()})
            except (TypeError, ValueError) as err:  # the config's message, in the flat keywords' names
                message = str(err)
                for attribute, (name, _) in values.items():
                    message = message.replace(f"{config.__name__}.{attribute}", name)
                raise type(err)(message) from None
            if target is not None:
                updates[held] = made if target is current else replace(current, iteration=made)
        return replace(out, **updates) if updates else out

    @property
    def composed(self) -> KindConfig | None:
        """The inner kind's config of a composing kind; None for a plain kind."""
        inner = getattr(self, "inner", None)
        return inner if isinstance(inner, KindConfig) else None

    def option_names(self) -> tuple[str, ...]:
        """Every option of this config: its own (fields and shortcuts), then the inner kind's that it does not have
        itself."""
        own = self.own_options()
        inner = self.composed
        return own if inner is None else own + tuple(n for n in inner.option_names() if n not in own)

    def holder(self, name: str) -> KindConfig | None:
        """The config that holds option `name` (this one, or the inner kind's); None if neither has it."""
        if name in self.own_options():
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
class PolarFactorOptions(KindConfig):
    """How a polar factor is computed (the Muon path and the last step of then_orthogonalize)."""

    backend: Auto | Eigh | NewtonSchulz | Literal["auto", "eigh", "newton_schulz"] = Auto()
    """NewtonSchulz(steps=5, coeffs=MUON_COEFFS, dtype="float32", method="auto"): Muon's quintic iteration on Y.
    Eigh(): the exact polar factor through the smaller Gram side's eigendecomposition. Auto(eigh_max_size=128): the
    iteration (Auto's `iteration`, NewtonSchulz() by default) for blocks whose Gram side exceeds eigh_max_size, eigh
    elsewhere. The strings "newton_schulz", "eigh", "auto" spell these; the flat keywords eigh_max_size, ns_steps,
    ns_coeffs, ns_dtype, ns_method set their fields (`shortcuts`)."""

    matrix_functions: ClassVar[dict[str, type]] = {"backend": NewtonSchulz}
    shortcuts: ClassVar[dict[str, tuple[str, type, str]]] = {
        "eigh_max_size": ("backend", Auto, "eigh_max_size"), "ns_steps": ("backend", NewtonSchulz, "steps"),
        "ns_coeffs": ("backend", NewtonSchulz, "coeffs"), "ns_dtype": ("backend", NewtonSchulz, "dtype"),
        "ns_method": ("backend", NewtonSchulz, "method")}


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
