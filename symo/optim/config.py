"""Symo's options: one dataclass per feature, and `SymoConfig`, which holds one of each.

    SymoConfig(beta2=0.95, backend="eigh")                       # flat keywords, as Symo(...) takes them
    SymoConfig(curvature=CurvatureConfig(beta2=0.95), matrix_function=MatrixFunctionConfig(backend="eigh"))
    cfg.beta2, cfg.curvature.beta2                               # the same value

Each feature checks its own values (TypeError / ValueError naming the option, as torch.optim does); the
checks that span two features run in `SymoConfig`. Every flat name is the feature's field name, except
the built-in AdamW's, which carry an `adamw_` prefix (`adamw_lr` is `AdamWConfig.lr`, `adamw_wd` its
weight_decay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from ..runtime.linalg import MUON_COEFFS
from .checks import adamw_checks, check_types, raise_first

SpecLike = Any  # str | Path | Spec | CompiledSpec (checked by check_types)


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
class CurvatureConfig:
    """What is estimated: the block statistics, their averaging, damping and the power applied."""

    beta2: float = 0.0
    """EMA of the curvature factors, bias-corrected. 0: the current statistic only (Muon); 1: a plain
    running sum with no correction (AdaGrad / original Shampoo)."""
    source: Literal["momentum", "gradient"] = "momentum"
    """Statistic of the preconditioned vector u (as Muon does) or of the raw gradient."""
    damping: float = 1e-6
    """Added to the curvature before negative powers; see `damping_mode`. Newton–Schulz on Y (the
    beta2 = 0 Muon path) approximates the undamped polar factor and ignores it."""
    damping_mode: Literal["relative", "absolute"] = "relative"
    """relative: x + damping * lambda_max per block, exact zeros stay zero (pseudo-inverse, docs/theory.md).
    absolute: x + damping on every eigenvalue (Shampoo's epsilon)."""
    estimator: Literal["gradient", "taylor"] = "gradient"
    """gradient: H = S_g^{1/2}. taylor: H = S_w^{-1} # S_g with S_w = R2(w - R1(w)) from the current
    weights (damped with `damping`, at least 1e-8 relative); invariant (trivial) blocks, where S_w
    vanishes, fall back to S_g^{1/2}."""
    power: float = -0.5
    """Exponent of S applied to u: -1/2 is H^{-1} (Newton-like); the taylor estimator applies H^{2 power}."""
    precondition_frequency: int = 1
    """Recompute the matrix functions every this many steps (the statistics update every step)."""
    stats_dtype: Literal["auto", "float64", "float32"] = "auto"
    """dtype of the stored block statistics (their EMA) and of their matrix functions (beta2 > 0,
    precondition_frequency > 1 or the taylor estimator; the Muon path stores nothing). float64
    keeps every direction the gradients hold: a float32 statistic knows its eigenvalues only to
    ~1e-7 lambda_max, and undamped S^{-1/2} must drop what lies below that. Cost: the Gram of each
    block's coordinates and the applied power run in float64 (docs/performance.md). auto: float64,
    except on devices without float64 (mps), where float32."""
    geometric_mean_with: SpecLike | None = None
    """A second spec whose curvature S2 commutes with the first (e.g. specs/shampoo_cols.toml with
    specs/shampoo_rows.toml): the preconditioner is the geometric mean (S1^{1/2} # S2^{1/2}), applied
    as S1^{power/2} S2^{power/2}: two-sided Shampoo L^{-1/4} G R^{-1/4}. Both specs must cover the same
    parameters; each keeps its own statistics."""

    def __post_init__(self) -> None:
        check_types(self)
        raise_first([
            (0.0 <= self.beta2 <= 1.0, "beta2 must be in [0, 1] (1 = running sum)"),
            (self.source in ("momentum", "gradient"), "source must be 'momentum' or 'gradient'"),
            (self.damping >= 0.0, "damping must be >= 0"),
            (self.damping_mode in ("relative", "absolute"), "damping_mode must be 'relative' or 'absolute'"),
            (self.estimator in ("gradient", "taylor"), "estimator must be 'gradient' or 'taylor'"),
            (self.power < 0.0, "power must be negative (it is applied to the curvature)"),
            (self.precondition_frequency >= 1, "precondition_frequency must be >= 1"),
            (self.stats_dtype in ("auto", "float64", "float32"), "stats_dtype must be auto|float64|float32"),
            (math.isfinite(self.damping), f"damping must be finite, got {self.damping}"),
            (math.isfinite(self.power), f"power must be finite, got {self.power}"),
        ])


@dataclass
class MatrixFunctionConfig:
    """How the powers of the small block matrices are computed (symo.optim.matrix_functions)."""

    backend: Literal["auto", "eigh", "newton_schulz"] = "auto"
    """Matrix functions: eigh (exact, float64 up to linalg.FLOAT64_EIGH_MAX, float64 retry on
    failure), newton_schulz (power -1/2 only: Muon's quintic on Y when beta2 = 0, the coupled
    inverse-root iteration otherwise), or auto. auto, Muon path: the quintic for blocks whose Gram
    side exceeds `eigh_max_size`, eigh elsewhere. auto, stored statistics: the coupled iteration only
    where it is both cheaper and accurate, i.e. on an accelerator, for a Gram side above
    `eigh_max_size`, with relative damping at or above linalg.ns_inverse_root_min_damping (float64
    statistics: 9e-8; float32: 1.2e-5); eigh elsewhere (on CPU eigh is 4-15x cheaper at every size,
    docs/performance.md). An explicit newton_schulz falls back to eigh for a matrix whose damping is
    below that floor, since the iteration cannot form a pseudo-inverse."""
    eigh_max_size: int = 128
    """auto backend: the largest Gram side solved by eigh."""
    ns_steps: int = 5
    """Newton–Schulz steps for the polar factor (Muon: 5)."""
    ns_coeffs: tuple[float, float, float] = MUON_COEFFS
    """Polar Newton–Schulz coefficients (a, b, c); (1.5, -0.5, 0) is the exactly convergent cubic."""
    ns_inverse_steps: int = 25
    """Coupled Newton–Schulz steps for A^{-1/2} when beta2 > 0."""
    ns_dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision of the polar Newton–Schulz iterations (Muon runs them in bfloat16 on GPUs); the
    input and output stay in the statistic's dtype."""
    ns_method: Literal["auto", "iterate", "spectral"] = "auto"
    """How the polar Newton–Schulz map is evaluated; both give Muon's quintic result up to rounding.
    iterate: the matrix-product iteration, as Muon runs it. spectral: the same polynomial map through
    one eigh of the smaller Gram (linalg.newton_schulz_spectral), cheaper on CPU for large or wide
    blocks. auto: spectral on CPU when ns_dtype is float32 and linalg.spectral_ns_is_cheaper says so
    for the block's shape, iterate elsewhere (on GPUs the products are fast and eigh is not)."""

    def __post_init__(self) -> None:
        check_types(self)
        raise_first([
            (self.ns_dtype in ("float32", "bfloat16"), "ns_dtype must be 'float32' or 'bfloat16'"),
            (self.ns_method in ("auto", "iterate", "spectral"), "ns_method must be auto|iterate|spectral"),
            (self.ns_method != "spectral" or self.ns_dtype == "float32",
             "ns_method='spectral' evaluates Newton-Schulz through a float32/float64 eigh; ns_dtype='bfloat16' "
             "applies to the iteration only: use ns_method='iterate' (or 'auto') with bfloat16"),
            (self.backend in ("auto", "eigh", "newton_schulz"), "backend must be auto|eigh|newton_schulz"),
            (self.eigh_max_size >= 1, f"eigh_max_size must be >= 1, got {self.eigh_max_size}"),
            (self.ns_steps >= 1, f"ns_steps must be >= 1, got {self.ns_steps}"),
            (self.ns_inverse_steps >= 1, f"ns_inverse_steps must be >= 1, got {self.ns_inverse_steps}"),
            (len(self.ns_coeffs) == 3 and all(math.isfinite(c) for c in self.ns_coeffs),
             f"ns_coeffs must be three finite numbers (a, b, c), got {self.ns_coeffs!r}"),
        ])


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
    weight_decay: float = 0.0
    """Decoupled weight decay of the covered parameters: w <- (1 - lr wd) w."""

    def __post_init__(self) -> None:
        check_types(self)
        raise_first([
            (self.update_scale in ("natural", "muon", "adamw"), "update_scale must be natural|muon|adamw"),
            (self.weight_decay >= 0.0 and math.isfinite(self.weight_decay),
             f"Invalid weight_decay value: {self.weight_decay} (must be a finite number >= 0)"),
            (self.adamw_rms > 0.0 and math.isfinite(self.adamw_rms), f"adamw_rms must be > 0, got {self.adamw_rms}"),
        ])


@dataclass
class AdamWConfig:
    """The built-in AdamW of the parameters the spec does not cover (flat names: adamw_lr, ...)."""

    lr: float = 3e-4
    """Its learning rate (its own param group, so LR schedulers scale it too)."""
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        raise_first(adamw_checks(self.lr, self.betas, self.eps, self.weight_decay))


@dataclass
class ExecutionConfig:
    """How the step runs; none of these changes the result beyond float rounding."""

    check_finite: bool = True
    """Raise NonFiniteGradientError naming the parameter when a gradient holds NaN/inf (one sync)."""
    batch_blocks: bool | Literal["auto"] = "auto"
    """Muon path: stack blocks of the same shape and constants (every layer's heads, every layer's MLP)
    along the batch axis and run one batched matrix function for them. False: one call per block
    (the same result up to float rounding). auto: stack on accelerators, where it saves kernel
    launches, not on CPU, where the stacking copies cost more than the calls they save (0.92x the
    batched step's time on gpt_bench, benchmarks/step_overhead.py)."""
    compile: bool = False
    """torch.compile(fullgraph=True) the Muon-style hot path (beta2 = 0, frequency 1, gradient
    estimator, no geometric mean): momentum -> coordinates -> polar -> scatter."""

    def __post_init__(self) -> None:
        check_types(self)
        raise_first([(self.batch_blocks in (True, False, "auto") and isinstance(self.batch_blocks, (bool, str)),
                       f"batch_blocks must be True, False or 'auto', got {self.batch_blocks!r}")])


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
        raise_first([
            (self.mode in ("auto", "off", "replicated", "fsdp"), "distributed_mode must be auto|off|replicated|fsdp"),
            (self.comm_dtype in ("auto", "float32", "float64", "bfloat16"),
             "distributed_comm_dtype must be auto|float32|float64|bfloat16"),
            (isinstance(self.bucket_mb, (int, float)) and not isinstance(self.bucket_mb, bool)
             and self.bucket_mb > 0 and math.isfinite(self.bucket_mb),
             f"distributed_bucket_mb must be a number > 0, got {self.bucket_mb!r}"),
        ])


FEATURES: dict[str, type] = {"momentum": MomentumConfig, "curvature": CurvatureConfig,
                             "matrix_function": MatrixFunctionConfig, "update": UpdateConfig,
                             "adamw": AdamWConfig, "execution": ExecutionConfig,
                             "distributed": DistributedConfig}
# flat option name -> (feature, field); the flat names are what Symo(...) and SymoConfig(...) take
_ADAMW_FLAT = {"lr": "adamw_lr", "betas": "adamw_betas", "eps": "adamw_eps", "weight_decay": "adamw_wd"}
_PREFIX = {"distributed": "distributed_"}
FLAT: dict[str, tuple[str, str]] = {
    (_ADAMW_FLAT[f.name] if feature == "adamw" else _PREFIX.get(feature, "") + f.name): (feature, f.name)
    for feature, cls in FEATURES.items() for f in fields(cls)}


@dataclass(init=False, repr=False, eq=False)
class SymoConfig:
    """Every Symo option, grouped by feature: `cfg.momentum`, `cfg.curvature`, `cfg.matrix_function`,
    `cfg.update`, `cfg.adamw`, `cfg.execution`, `cfg.distributed`. Flat names (`cfg.beta2`, `SymoConfig(beta2=0.9)`,
    `dataclasses.replace(cfg, beta2=0.9)`) read and set the same values; `Symo(..., **overrides)` takes
    the flat names and the feature names. Each feature is copied in, never shared between configs."""

    momentum: MomentumConfig
    curvature: CurvatureConfig
    matrix_function: MatrixFunctionConfig
    update: UpdateConfig
    adamw: AdamWConfig
    execution: ExecutionConfig
    distributed: DistributedConfig

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(FLAT) - set(FEATURES))
        if unknown:
            raise TypeError(f"SymoConfig got unknown option(s) {unknown}; the options are {sorted(FLAT)}")
        for feature, cls in FEATURES.items():
            given = options.get(feature)
            if given is not None and not isinstance(given, cls):
                raise TypeError(f"{feature} must be a {cls.__name__}, got {type(given).__name__}")
            flat = {fld: options[name] for name, (feat, fld) in FLAT.items() if feat == feature and name in options}
            value = replace(given, **flat) if given is not None else cls(**flat)
            object.__setattr__(self, feature, value)
        raise_first([  # the checks that span two features
            (self.backend != "newton_schulz" or (self.power == -0.5 and self.geometric_mean_with is None),
             "the newton_schulz backend computes the -1/2 power only (power = -0.5, no geometric mean)"),
        ])

    def __getattr__(self, name: str) -> Any:
        if name in FLAT:
            feature, fld = FLAT[name]
            return getattr(getattr(self, feature), fld)
        raise AttributeError(f"SymoConfig has no option {name!r}; the options are {sorted(FLAT)}")

    def __setattr__(self, name: str, value: Any) -> None:
        """Set one option in place (a schedule that changes `power` during training); not re-validated."""
        if name in FLAT:
            feature, fld = FLAT[name]
            setattr(getattr(self, feature), fld, value)
        elif name in FEATURES:
            object.__setattr__(self, name, value)
        else:
            raise AttributeError(f"SymoConfig has no option {name!r}; the options are {sorted(FLAT)}")

    def flat(self) -> dict[str, Any]:
        """{flat option name: value}, every option."""
        return {name: getattr(self, name) for name in FLAT}

    def replace(self, **changes: Any) -> SymoConfig:
        """A copy with `changes` (flat names or feature names) applied and checked."""
        base = {feature: getattr(self, feature) for feature in FEATURES if feature not in changes}
        return SymoConfig(**{k: replace(v) for k, v in base.items()}, **changes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymoConfig) and all(getattr(self, f) == getattr(other, f) for f in FEATURES)

    def __repr__(self) -> str:
        return "SymoConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.flat().items()) + ")"

    def __reduce__(self) -> tuple:  # pickle and copy.deepcopy: rebuilt from the features
        return _rebuild, ({feature: getattr(self, feature) for feature in FEATURES},)

    @property
    def muon_path(self) -> bool:
        """One statistic, used at once, of the vector it preconditions: the polar-factor fast path."""
        return (self.beta2 == 0.0 and self.precondition_frequency == 1 and self.estimator == "gradient"
                and self.geometric_mean_with is None)



def _rebuild(features: dict[str, Any]) -> SymoConfig:
    return SymoConfig(**features)
