"""The kinds' options: `KindConfig`, the base of every kind's config dataclass, and the option groups a kind's
config is built from (the statistic and its average, damping, the power, the polar factor, Adam's moments).
Each group validates its own fields and names the one that is wrong."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Literal

from ..checks import check_types, raise_first
from ..matrix_function_configs import Auto, Eigh, MatrixFunction, NewtonSchulz, iteration_of, spelled


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
