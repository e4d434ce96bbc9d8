"""Symo's options: one dataclass per feature, one per preconditioner kind, and `SymoConfig`, which holds
them.

    SymoConfig(preconditioner="root", beta2=0.95, backend="eigh")     # flat keywords, as Symo(...) takes them
    SymoConfig(preconditioner=RootConfig(beta2=0.95), momentum=MomentumConfig(beta1=0.9))
    cfg.beta2, cfg.preconditioner.beta2                                 # the same value

The preconditioner kind (symo.optim.kinds: polar, root, taylor, published, eigen_adam, then_orthogonalize)
owns its options; an option of another kind is refused with a message naming the kinds it belongs to. Each
feature checks its own values (TypeError / ValueError naming the option, as torch.optim does). Every flat name
is the field's name, except the built-in AdamW's, which carry an `adamw_` prefix (`adamw_lr` is
`AdamWConfig.lr`, `adamw_wd` its weight_decay) and the distributed ones (`distributed_mode`, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from ..compiler.errors import did_you_mean
from .checks import adamw_checks, check_types, raise_first
from .kinds import KINDS, KindConfig
from .presets import PRESETS


@dataclass
class MomentumConfig:
    """Gradient momentum of the covered parameters."""

    beta1: float = 0.95
    """Momentum, Muon's EMA form m <- beta1 m + (1 - beta1) g. 0 disables momentum."""
    nesterov: bool = True
    """Precondition u = (1 - beta1) g + beta1 m (Muon's Nesterov blend) instead of m."""

    def __post_init__(self) -> None:
        check_types(self)
        raise_first([(0.0 <= self.beta1 < 1.0, "beta1 must be in [0, 1)")])


@dataclass
class UpdateConfig:
    """The scale of the covered parameters' update and their weight decay."""

    update_scale: Literal["natural", "muon", "adamw"] = "natural"
    """natural: S^{power} u as is (entries of RMS ~1: Adam-like learning rates). muon: the natural
    d^{-power} factor divided out and sqrt(max(1, width / mult)) applied (rows / cols for a Muon
    spec): Muon's update and learning rates. adamw: each block's update rescaled to RMS
    `adamw_rms` (Moonlight's matching, use AdamW's learning rate)."""
    adamw_rms: float = 0.2
    """Target RMS of a block's update under update_scale = "adamw"."""
    parameter_rms: bool = True
    """update_scale="muon": a parameter that is not its own rows x cols block (a true-symmetry spec groups
    several parameters, or a whole matrix, into one block) gets its update rescaled to the RMS Muon gives a
    full-rank matrix of its shape, 1/sqrt(fan_in), so one learning rate serves every spec of a model
    (symo/optim/parameter_rms.py). Parameters that are their own block (Muon-style specs) keep Muon's update
    exactly. False: Muon's per-block factor alone."""
    weight_decay: float = 0.0
    """Decoupled weight decay of the covered parameters: w <- (1 - lr wd) w."""
    neuron_norm_beta2: float | None = None
    """NorMuon's neuron-wise normalization of a polar-factor kind's update (muon, then_orthogonalize, soap_muon):
    each row of a covered matrix's update (its first axis, the rest flattened) divided by the root of an EMA at
    this rate of the row's mean square, then the update rescaled to its norm before (symo/optim/neuron_norm.py;
    NorMuon's 0.95). Refused where an orthogonal space acts on the rows. None: off."""

    def __post_init__(self) -> None:
        check_types(self)
        beta = self.neuron_norm_beta2
        raise_first([
            (self.weight_decay >= 0.0 and math.isfinite(self.weight_decay),
             f"Invalid weight_decay value: {self.weight_decay} (must be a finite number >= 0)"),
            (beta is None or 0.0 <= beta < 1.0, f"neuron_norm_beta2 must be in [0, 1) or None (off), got {beta}"),
            (self.adamw_rms > 0.0 and math.isfinite(self.adamw_rms), f"adamw_rms must be > 0, got {self.adamw_rms}"),
        ])


ADAMW_LR = 3e-3
"""The built-in AdamW's rate at the covered parameters' documented rate (AdamWConfig.lr)."""


@dataclass
class AdamWConfig:
    """The built-in AdamW of the parameters the spec does not cover (flat names: adamw_lr, ...)."""

    lr: float | None = None
    """Its learning rate (its own param group, so LR schedulers scale it too). None: it follows the covered
    parameters' rate, `ADAMW_LR` (3e-3) when `lr` is the documented rate (the preset's; without a preset 1e-3
    at the natural scale, 0.02 at Muon's, 3e-3 at AdamW's) and in proportion otherwise, so a sweep of `lr`
    moves both sides. 3e-3 is the rate `symo train` uses: on the
    bundled GPT and on a user's attention block, 3e-4 left the embeddings, gains and biases undertrained (a
    validation loss of 1.72 against 1.28 at 3e-3 on the attention block). A number fixes it."""
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        raise_first(adamw_checks(ADAMW_LR if self.lr is None else self.lr, self.betas, self.eps, self.weight_decay))


@dataclass
class ExecutionConfig:
    """How the step runs; none of these changes the result beyond float rounding."""

    check_finite: bool = True
    """Raise NonFiniteGradientError naming the parameter when a gradient holds NaN/inf (one sync)."""
    batch_blocks: bool | Literal["auto"] = "auto"
    """polar kind: stack blocks of the same shape and constants (every layer's heads, every layer's MLP)
    along the batch axis and run one batched matrix function for them. False: one call per block
    (the same result up to float rounding). auto: stack on accelerators, where it saves kernel
    launches, not on CPU, where the stacking copies cost more than the calls they save (0.92x the
    batched step's time on gpt_bench, benchmarks/step_overhead.py)."""
    compile: bool = False
    """torch.compile(fullgraph=True) the polar kind's step (Muon's hot path): momentum -> coordinates ->
    polar factor -> scatter. Other kinds run eagerly."""

    def __post_init__(self) -> None:
        check_types(self)


@dataclass
class DistributedConfig:
    """Several processes (flat names: distributed_mode, ...; docs/distributed.md). Each coupling
    component of blocks gets one owner rank, which alone computes its matrix functions and keeps its
    statistics; the updates are then shared. Nothing here changes the result beyond float rounding,
    except a lower `comm_dtype`."""

    mode: Literal["auto", "off", "replicated", "fsdp"] = "auto"
    """fsdp: parameters are FSDP2 DTensors sharded on dim 0 (`fully_shard`): each component's shards
    travel to its owner and the updates' shards come back (one all-to-all per dtype and bucket, each
    way). replicated: every rank holds the whole parameters and the same gradients (DDP): each rank
    computes its own components and the updates are all-gathered. off: every rank steps alone on
    what it holds (a single process). auto: fsdp when the parameters are DTensors, off otherwise
    (plain tensors on several ranks may be DDP replicas or different pipeline stages; say replicated
    for DDP)."""
    comm_dtype: Literal["auto", "float32", "float64", "bfloat16"] = "auto"
    """dtype of the exchanged tensors; auto: the momentum's own dtype (exact)."""
    bucket_mb: float = 256.0
    """Largest exchange buffer in MiB; a larger exchange is split into several collectives."""

    def __post_init__(self) -> None:
        check_types(self, prefix=_PREFIX["distributed"])
        raise_first([(self.bucket_mb > 0 and math.isfinite(self.bucket_mb),
                      f"distributed_bucket_mb must be a number > 0, got {self.bucket_mb!r}")])


FEATURES: dict[str, type] = {"momentum": MomentumConfig, "update": UpdateConfig, "adamw": AdamWConfig,
                             "execution": ExecutionConfig, "distributed": DistributedConfig}
# flat option name -> (feature, field); the flat names are what Symo(...) and SymoConfig(...) take
_ADAMW_FLAT = {"lr": "adamw_lr", "betas": "adamw_betas", "eps": "adamw_eps", "weight_decay": "adamw_wd"}
_PREFIX = {"distributed": "distributed_"}
FLAT: dict[str, tuple[str, str]] = {
    (_ADAMW_FLAT[f.name] if feature == "adamw" else _PREFIX.get(feature, "") + f.name): (feature, f.name)
    for feature, cls in FEATURES.items() for f in fields(cls)}


def _kind_options(cls: type[KindConfig]) -> tuple[str, ...]:
    """Every option a kind can have: its fields and, for a composing kind, those of each kind it can hold."""
    own = cls.own_options()
    inner = (n for make in cls.inner_kinds.values() for n in _kind_options(type(make())))
    return tuple(dict.fromkeys((*own, *inner)))


# kind -> its options; an option name -> the kinds that have it
KIND_OPTIONS: dict[str, tuple[str, ...]] = {k: _kind_options(c) for k, (c, _) in KINDS.items()}
OWNERS: dict[str, list[str]] = {name: [k for k, names in KIND_OPTIONS.items() if name in names]
                                 for name in dict.fromkeys(n for names in KIND_OPTIONS.values() for n in names)}
DEFAULT_KIND = "polar"
_WHY = {"polar": "the polar kind (Symo's default, Muon's step) uses this step's statistic alone"}


# option names of the well-known implementations (torch's Adam, pytorch-optimizer's and heavyball's SOAP) that Symo
# spells otherwise, or has no counterpart of: what a user coming from them needs to hear
OTHER_LIBRARIES = {
    "betas": "SOAP's and Adam's betas=(b1, b2) are Symo's beta1=b1, the momentum, and adam_beta2=b2, the SOAP kinds' "
             "second moment",
    "shampoo_beta": "SOAP's shampoo_beta is Symo's beta2, the EMA of the Kronecker statistics",
    "merge_dims": "Symo has no merge_dims: the spec decides which coordinates form a block",
    "learning_rate": "the learning rate is Symo(..., lr=...)",
    "precondition_1d": "Symo has no precondition_1d: a 1-D parameter is preconditioned where the spec covers it "
                       "and goes to Symo's AdamW otherwise",
}


def spelling_hint(name: str, options: list[str]) -> str:
    """' (what `name` is called here)' for another library's name, ' (did you mean ...?)' naming the nearest of
    `options` for a near miss, or ''."""
    if name in OTHER_LIBRARIES:
        return f" ({OTHER_LIBRARIES[name]})"
    return did_you_mean(name, options)


def not_an_option(name: str, kind: str) -> TypeError:
    """The error for an option the chosen kind does not have: which kinds have it, or what the options are."""
    owners = OWNERS.get(name)
    if owners:
        why = _WHY.get(kind, f"preconditioner {kind!r} does not use it")
        presets = [p.name for p in PRESETS.values() if p.values.get("preconditioner") in owners]
        return TypeError(f"{name} is not an option of preconditioner {kind!r} ({why}); it is an option of "
                         f"{', '.join(owners)}: pass preconditioner={owners[0]!r}, or a preset of one of them "
                         f"({', '.join(presets)}), to use it")
    if name in FEATURES:
        return TypeError(f"{name} must be a {FEATURES[name].__name__}")
    every = [*FLAT, *FEATURES, "preconditioner", *OWNERS]
    return TypeError(f"unknown option {name!r}{spelling_hint(name, every)}; the options are {sorted(FLAT)}, "
                     f"'preconditioner' and the "
                     f"options of the chosen kind ({kind}: {list(KIND_OPTIONS[kind])})")


def make_kind_config(value: Any, changes: dict[str, Any]) -> KindConfig:
    """A kind's config from a kind name or a config instance, with `changes` (flat names) applied."""
    if isinstance(value, KindConfig):
        kind, base = value.kind, value
    elif isinstance(value, str) and value in KINDS:
        kind, base = value, None
    else:
        raise ValueError(f"preconditioner must be one of {list(KINDS)} or one of their configs "
                         f"(symo.optim.kinds), got {value!r}")
    for name in changes:
        if name not in KIND_OPTIONS[kind]:
            raise not_an_option(name, kind)
    return configured(KINDS[kind][0]() if base is None else base, changes)


def configured(base: KindConfig, changes: dict[str, Any]) -> KindConfig:
    """`base` with `changes` applied: its own fields here, the others to the inner kind's config of a composing
    kind (`inner="name"` first, which starts that kind from its default)."""
    own = set(base.own_options())
    mine = {k: v for k, v in changes.items() if k in own}
    rest = {k: v for k, v in changes.items() if k not in own}
    if isinstance(mine.get("inner"), str) and mine["inner"] in base.inner_kinds:
        mine["inner"] = base.inner_kinds[mine["inner"]]()
    if rest:
        inner = mine.get("inner", base.composed)
        if not isinstance(inner, KindConfig):
            raise not_an_option(next(iter(rest)), base.kind)
        for name in rest:
            if name not in inner.option_names():
                names = list(base.own_options()) + [n for n in inner.option_names() if n not in own]
                raise TypeError(f"{name} is not an option of preconditioner {base.kind!r} with inner {inner.kind!r}"
                                f"{spelling_hint(name, names)}; its options are {names}")
        mine["inner"] = configured(inner, rest)
    return base.with_options(mine)


@dataclass(init=False, repr=False, eq=False)
class SymoConfig:
    """Every Symo option: the preconditioner kind's config `cfg.preconditioner`, and one config per feature:
    `cfg.momentum`, `cfg.update`, `cfg.adamw`, `cfg.execution`, `cfg.distributed`. Flat names (`cfg.beta2`,
    `SymoConfig(preconditioner="root", beta2=0.9)`, `cfg.replace(beta2=0.9)`) read and set the same values;
    `Symo(..., **overrides)` takes the flat names, the feature names and `preconditioner`. Each config is copied
    in, never shared."""

    momentum: MomentumConfig
    update: UpdateConfig
    adamw: AdamWConfig
    execution: ExecutionConfig
    distributed: DistributedConfig
    preconditioner: KindConfig

    def __init__(self, **options: Any) -> None:
        kind = options.pop("preconditioner", DEFAULT_KIND)
        kind_name = kind.kind if isinstance(kind, KindConfig) else kind
        for feature, cls in FEATURES.items():
            given = options.get(feature)
            if given is not None and not isinstance(given, cls):
                hint = (" (the momentum coefficient is the option beta1, e.g. beta1=0.9)" if feature == "momentum"
                        else "")
                raise TypeError(f"{feature} must be a {cls.__name__}{hint}, got {type(given).__name__}")
        rest = {k: v for k, v in options.items() if k not in FLAT and k not in FEATURES}
        if isinstance(kind_name, str) and kind_name in KINDS:
            for name in rest:
                if name not in KIND_OPTIONS[kind_name]:
                    raise not_an_option(name, kind_name)
        object.__setattr__(self, "preconditioner", make_kind_config(kind, rest))
        for feature, cls in FEATURES.items():
            given = options.get(feature)
            flat = {fld: options[name] for name, (feat, fld) in FLAT.items() if feat == feature and name in options}
            value = replace(given, **flat) if given is not None else cls(**flat)
            object.__setattr__(self, feature, value)
        kind_cls = KINDS[self.kind][1]
        raise_first([(self.update_scale in kind_cls.update_scales,
                      f"update_scale={self.update_scale!r} has no meaning for preconditioner {self.kind!r}; use "
                      f"{' or '.join(repr(s) for s in kind_cls.update_scales)}")])

    @property
    def kind(self) -> str:
        """The preconditioner kind's name."""
        return self.preconditioner.kind

    def __getattr__(self, name: str) -> Any:
        if name in FLAT:
            feature, fld = FLAT[name]
            return getattr(getattr(self, feature), fld)
        if name in OWNERS:
            pre = self.__dict__.get("preconditioner")
            holder = None if pre is None else pre.holder(name)
            if holder is not None:
                return getattr(holder, name)
            raise AttributeError(str(not_an_option(name, pre.kind if pre is not None else DEFAULT_KIND)))
        raise AttributeError(f"SymoConfig has no option {name!r}; the options are {sorted(FLAT)}, 'preconditioner' "
                             "and the kind's options")

    def __setattr__(self, name: str, value: Any) -> None:
        """Set one option in place (a schedule that changes `power` during training); not re-validated. The matrix
        functions (`backend` and its flat keywords) are fixed at construction: each block's plan holds its own."""
        holder = self.preconditioner.holder(name) if name not in FLAT else None
        if holder is not None and (name in holder.matrix_functions or name in holder.shortcuts):
            raise AttributeError(f"{name} is fixed when the optimizer is built (each block's plan holds its matrix "
                                 f"function): build a new optimizer with opt.config.replace({name}=...)")
        if name in FLAT:
            feature, fld = FLAT[name]
            setattr(getattr(self, feature), fld, value)
        elif self.preconditioner.holder(name) is not None:
            setattr(self.preconditioner.holder(name), name, value)
        elif name in FEATURES or name == "preconditioner":
            raise AttributeError(f"replace the whole {name} with cfg.replace({name}=...) and a new optimizer")
        else:
            raise AttributeError(str(not_an_option(name, self.kind)))

    def flat(self) -> dict[str, Any]:
        """{flat option name: value}: every option, the kind's included (a composing kind's `inner` by its name, and the
        inner kind's options beside it)."""
        out = {name: getattr(self, name) for name in FLAT}
        kind = {n: self.preconditioner.option(n) for n in self.preconditioner.option_names()}
        if "inner" in kind:  # a composing kind: its inner kind by name, whose options are listed flat beside it
            kind["inner"] = kind["inner"].kind
        return {**out, "preconditioner": self.kind, **kind}

    def replace(self, **changes: Any) -> SymoConfig:
        """A copy with `changes` (flat names, feature names or `preconditioner`) applied and checked; the
        kind's options carry over unless `preconditioner` names another kind."""
        kind = changes.pop("preconditioner", None)
        same = kind is None or kind == self.kind
        pre = replace(self.preconditioner) if same else kind
        base = {feature: replace(getattr(self, feature)) for feature in FEATURES if feature not in changes}
        return SymoConfig(**base, preconditioner=pre, **changes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymoConfig) and all(
            getattr(self, f) == getattr(other, f) for f in (*FEATURES, "preconditioner"))

    def __repr__(self) -> str:
        if not all(f in self.__dict__ for f in (*FEATURES, "preconditioner")):
            return "SymoConfig(<being built>)"
        return "SymoConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.flat().items()) + ")"

    def __reduce__(self) -> tuple:  # pickle and copy.deepcopy: rebuilt from the configs
        return _rebuild, ({f: getattr(self, f) for f in (*FEATURES, "preconditioner")},)


def _rebuild(configs: dict[str, Any]) -> SymoConfig:
    return SymoConfig(**configs)
