"""`Symo`: a torch optimizer whose preconditioner is the spec's orbit-averaged curvature (docs/theory.md).

    model = symo.models.gpt_bench()
    opt = symo.Symo(model.named_parameters(), "specs/gpt_muon.toml", lr=0.02, update_scale="muon")
    print(opt.describe())                      # which parameters are preconditioned, which go to AdamW

Per step, for the parameters the spec covers:

    m  <- beta1 m + (1 - beta1) g                         (Muon's lerp form; u = Nesterov blend or m)
    A  <- EMA_beta2 of Y Y^T / d per isotypic block, Y = the block coordinates of u (or of g)
    w  <- (1 - lr wd) w - lr * scale * A^{power} u          (power -1/2: S^{-1/2} u, the default H_g^{-1})

With beta2 = 0 the statistic is the current vector alone and A^{-1/2} Y = sqrt(d) polar(Y): Muon.
Nothing per block is stored then, and the polar factor comes from Newton–Schulz on Y or from the
smaller Gram side's eigh. Uncovered parameters (embeddings, gains, biases) get a built-in AdamW.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import torch

from .compiler import Spec
from .optim_checks import _adamw_checks, _check_group_options, _check_state_dict, _check_types
from .presets import get_preset
from .runtime.compiled import CompiledSpec, NonFiniteUpdateError, check_finite_tensors, fit_lines, summarize_names
from .runtime.linalg import (
    FLOAT64_EIGH_MAX,
    MUON_COEFFS,
    geometric_mean,
    gram_power_apply,
    inv_sqrt_newton_schulz,
    lowrank_power_apply,
    newton_schulz,
    newton_schulz_spectral,
    ns_inverse_root_is_accurate,
    ns_inverse_root_min_damping,
    spectral_ns_is_cheaper,
    sym_power,
)

SpecLike = str | Path | Spec | CompiledSpec
NamedParams = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor] | Iterable[dict[str, Any]]

# Options a param group may override; the curvature options are per block, and a block may span
# parameters of several groups, so those stay global (SymoConfig).
GROUP_KEYS = ("lr", "beta1", "nesterov", "weight_decay", "adamw_lr", "adamw_betas", "adamw_eps", "adamw_wd")


@dataclass
class SymoConfig:
    """Every Symo option, with its default. `Symo(..., **overrides)` sets any of them by name."""

    beta1: float = 0.95
    """Momentum, Muon's EMA form m <- beta1 m + (1 - beta1) g. 0 disables momentum."""
    nesterov: bool = True
    """Precondition u = (1 - beta1) g + beta1 m (Muon's Nesterov blend) instead of m."""
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
    weight_decay: float = 0.0
    """Decoupled weight decay of the covered parameters: w <- (1 - lr wd) w."""
    update_scale: Literal["natural", "muon", "adamw"] = "natural"
    """natural: S^{power} u as is (entries of RMS ~1: Adam-like learning rates). muon: the natural
    d^{-power} factor divided out and sqrt(max(1, width / mult)) applied (rows / cols for a Muon
    spec): Muon's update and learning rates. adamw: each block's update rescaled to RMS
    `adamw_rms` (Moonlight's matching, use AdamW's learning rate)."""
    adamw_rms: float = 0.2
    """Target RMS of a block's update under update_scale = "adamw"."""
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
    stats_dtype: Literal["auto", "float64", "float32"] = "auto"
    """dtype of the stored block statistics (their EMA) and of their matrix functions (beta2 > 0,
    precondition_frequency > 1 or the taylor estimator; the Muon path stores nothing). float64
    keeps every direction the gradients hold: a float32 statistic knows its eigenvalues only to
    ~1e-7 lambda_max, and undamped S^{-1/2} must drop what lies below that. Cost: the Gram of each
    block's coordinates and the applied power run in float64 (docs/performance.md). auto: float64,
    except on devices without float64 (mps), where float32."""
    ns_steps: int = 5
    """Newton–Schulz steps for the polar factor (Muon: 5)."""
    ns_coeffs: tuple[float, float, float] = MUON_COEFFS
    """Polar Newton–Schulz coefficients (a, b, c); (1.5, -0.5, 0) is the exactly convergent cubic."""
    ns_inverse_steps: int = 25
    """Coupled Newton–Schulz steps for A^{-1/2} when beta2 > 0."""
    geometric_mean_with: SpecLike | None = None
    """A second spec whose curvature S2 commutes with the first (e.g. specs/shampoo_cols.toml with
    specs/shampoo_rows.toml): the preconditioner is the geometric mean (S1^{1/2} # S2^{1/2}), applied
    as S1^{power/2} S2^{power/2}: two-sided Shampoo L^{-1/4} G R^{-1/4}. Both specs must cover the same
    parameters; each keeps its own statistics."""
    adamw_lr: float = 3e-4
    """Learning rate of the built-in AdamW for uncovered parameters (its own param group, so LR
    schedulers scale it too)."""
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    adamw_wd: float = 0.0
    check_finite: bool = True
    """Raise NonFiniteGradientError naming the parameter when a gradient holds NaN/inf (one sync)."""
    batch_blocks: bool | Literal["auto"] = "auto"
    """Muon path: stack blocks of the same shape and constants (every layer's heads, every layer's MLP)
    along the batch axis and run one batched matrix function for them. False: one call per block
    (the same result up to float rounding). auto: stack on accelerators, where it saves kernel
    launches, not on CPU, where the stacking copies cost more than the calls they save (0.92x the
    batched step's time on gpt_bench, benchmarks/step_overhead.py)."""
    ns_dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision of the polar Newton–Schulz iterations (Muon runs them in bfloat16 on GPUs); the
    input and output stay in the statistic's dtype."""
    ns_method: Literal["auto", "iterate", "spectral"] = "auto"
    """How the polar Newton–Schulz map is evaluated; both give Muon's quintic result up to rounding.
    iterate: the matrix-product iteration, as Muon runs it. spectral: the same polynomial map through
    one eigh of the smaller Gram (linalg.newton_schulz_spectral), cheaper on CPU for large or wide
    blocks. auto: spectral on CPU when ns_dtype is float32 and linalg.spectral_ns_is_cheaper says so
    for the block's shape, iterate elsewhere (on GPUs the products are fast and eigh is not)."""
    compile: bool = False
    """torch.compile(fullgraph=True) the Muon-style hot path (beta2 = 0, frequency 1, gradient
    estimator, no geometric mean): momentum -> coordinates -> polar -> scatter."""

    def __post_init__(self) -> None:
        _check_types(self)
        checks = [
            (0.0 <= self.beta1 < 1.0, "beta1 must be in [0, 1)"),
            (0.0 <= self.beta2 <= 1.0, "beta2 must be in [0, 1] (1 = running sum)"),
            (self.source in ("momentum", "gradient"), "source must be 'momentum' or 'gradient'"),
            (self.damping >= 0.0, "damping must be >= 0"),
            (self.damping_mode in ("relative", "absolute"), "damping_mode must be 'relative' or 'absolute'"),
            (self.estimator in ("gradient", "taylor"), "estimator must be 'gradient' or 'taylor'"),
            (self.power < 0.0, "power must be negative (it is applied to the curvature)"),
            (self.precondition_frequency >= 1, "precondition_frequency must be >= 1"),
            (self.update_scale in ("natural", "muon", "adamw"), "update_scale must be natural|muon|adamw"),
            (self.ns_dtype in ("float32", "bfloat16"), "ns_dtype must be 'float32' or 'bfloat16'"),
            (self.ns_method in ("auto", "iterate", "spectral"), "ns_method must be auto|iterate|spectral"),
            (self.batch_blocks in (True, False, "auto") and isinstance(self.batch_blocks, (bool, str)),
             f"batch_blocks must be True, False or 'auto', got {self.batch_blocks!r}"),
            (self.ns_method != "spectral" or self.ns_dtype == "float32",
             "ns_method='spectral' evaluates Newton-Schulz through a float32/float64 eigh; ns_dtype='bfloat16' "
             "applies to the iteration only: use ns_method='iterate' (or 'auto') with bfloat16"),
            (self.backend in ("auto", "eigh", "newton_schulz"), "backend must be auto|eigh|newton_schulz"),
            (self.stats_dtype in ("auto", "float64", "float32"), "stats_dtype must be auto|float64|float32"),
            (self.backend != "newton_schulz" or (self.power == -0.5 and self.geometric_mean_with is None),
             "the newton_schulz backend computes the -1/2 power only (power = -0.5, no geometric mean)"),
            # as torch.optim validates its options: finite, in range, the option named
            (math.isfinite(self.damping), f"damping must be finite, got {self.damping}"),
            (math.isfinite(self.power), f"power must be finite, got {self.power}"),
            (self.weight_decay >= 0.0 and math.isfinite(self.weight_decay),
             f"Invalid weight_decay value: {self.weight_decay} (must be a finite number >= 0)"),
            (self.adamw_rms > 0.0 and math.isfinite(self.adamw_rms), f"adamw_rms must be > 0, got {self.adamw_rms}"),
            (self.eigh_max_size >= 1, f"eigh_max_size must be >= 1, got {self.eigh_max_size}"),
            (self.ns_steps >= 1, f"ns_steps must be >= 1, got {self.ns_steps}"),
            (self.ns_inverse_steps >= 1, f"ns_inverse_steps must be >= 1, got {self.ns_inverse_steps}"),
            (len(self.ns_coeffs) == 3 and all(math.isfinite(c) for c in self.ns_coeffs),
             f"ns_coeffs must be three finite numbers (a, b, c), got {self.ns_coeffs!r}"),
            *_adamw_checks(self.adamw_lr, self.adamw_betas, self.adamw_eps, self.adamw_wd),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def muon_path(self) -> bool:
        """One statistic, used at once, of the vector it preconditions: the polar-factor fast path."""
        return (self.beta2 == 0.0 and self.precondition_frequency == 1 and self.estimator == "gradient"
                and self.geometric_mean_with is None)


@dataclass
class _Stage:
    """One compiled spec's blocks with their static per-block constants."""

    compiled: CompiledSpec
    key: str                                  # optimizer-state key: "symo_blocks" / "symo_gm_blocks"
    power: float
    consts: dict[str, dict[str, Any]] = field(default_factory=dict)


class Symo(torch.optim.Optimizer):
    """Symmetry-structured preconditioning: the spec's commutant curvature, per isotypic block.

    Args:
        params: named parameters (`model.named_parameters()`, a {name: param} dict) or param groups:
            dicts with "params": [(name, param), ...] plus any of `GROUP_KEYS`.
        spec: a spec path, a parsed `Spec`, or a `CompiledSpec` (compiled here for the given shapes).
        lr: learning rate of the covered parameters (see `SymoConfig.update_scale` for its scale);
            None: the preset's recommended rate, or 1e-3 without a preset.
        config: a `SymoConfig`; keyword `overrides` replace its fields.
        preset: "paper", "muon" or "shampoo" (symo.presets): start from that configuration instead of
            the SymoConfig defaults; keyword `overrides` replace its values. Not with `config`.
        sizes: space sizes the shapes cannot decide (as in `symo.compile`).
        strict: False lets the spec cover more parameters than are given (fine-tuning a subset): its
            entries for absent parameters are dropped, as `symo.compile(..., strict=False)` does.

    Each user group becomes up to two torch param groups, `kind` "symo" (covered) and "adamw"
    (uncovered, with "lr" = adamw_lr), so schedulers, `zero_grad` and `state_dict` act on both.
    """

    def __init__(self, params: NamedParams, spec: SpecLike, lr: float | None = None,
                 config: SymoConfig | None = None, *, preset: str | None = None,
                 sizes: dict[str, int] | None = None, strict: bool = True, **overrides: Any) -> None:
        if config is not None and not isinstance(config, SymoConfig):
            raise TypeError(f"config must be a SymoConfig, got {type(config).__name__}")
        unknown = sorted(set(overrides) - {f.name for f in fields(SymoConfig)})
        if unknown:
            raise TypeError(f"Symo got unknown option(s) {unknown}; the options are the fields of SymoConfig")
        self.preset = None if preset is None else get_preset(preset)
        if self.preset is not None and config is not None:
            raise ValueError(f"pass preset={preset!r} or config=, not both; override a preset's values by "
                             "keyword, e.g. Symo(params, spec, preset='paper', beta2=0.99)")
        if lr is None:
            lr = self.preset.lr if self.preset is not None else 1e-3
        # what describe() compares against: the preset, or the documented defaults
        self._base_config = SymoConfig(**self.preset.values) if self.preset is not None else SymoConfig()
        cfg = replace(config or self._base_config, **overrides)
        self.config = cfg
        if sizes is not None and not isinstance(sizes, Mapping):
            raise TypeError(f"sizes must be a dict {{space: int}}, got {type(sizes).__name__}")
        if not isinstance(spec, (str, Path, Spec, CompiledSpec)):
            raise TypeError(f"spec must be a path, a bundled spec name, a Spec or a CompiledSpec, got "
                            f"{type(spec).__name__}")
        user_groups = _normalise_groups(params)
        for gi, g in enumerate(user_groups):  # before compiling: a bad option fails fast
            _check_group_options({k: g.get(k, lr if k == "lr" else getattr(cfg, k)) for k in GROUP_KEYS},
                                 "" if len(user_groups) == 1 else f"param group {gi}: ")
        named = {n: p for g in user_groups for n, p in g["params"]}
        shapes = {n: tuple(p.shape) for n, p in named.items()}
        self._device = next(iter(named.values())).device
        self._stats_dtype = _resolve_stats_dtype(cfg.stats_dtype, self._device)
        self.compiled = _compile(spec, shapes, sizes, strict)
        covered = set(self.compiled.param_names)
        missing = sorted(covered - set(named))
        if missing:
            raise ValueError(f"the spec covers parameters that were not given to the optimizer: {missing}")
        stages = [_Stage(self.compiled, "symo_blocks", cfg.power)]
        if cfg.geometric_mean_with is not None:
            second = _compile(cfg.geometric_mean_with, shapes, sizes, strict)
            if set(second.param_names) != covered:
                raise ValueError("geometric_mean_with: both specs must cover the same parameters; "
                                 f"they differ on {sorted(covered ^ set(second.param_names))}")
            stages = [_Stage(self.compiled, "symo_blocks", cfg.power / 2),
                      _Stage(second, "symo_gm_blocks", cfg.power / 2)]
        for k, stage in enumerate(stages):
            transposed = _square_transposed_blocks(stage.compiled)
            for b in stage.compiled.blocks:
                stage.consts[b.id] = self._block_consts(b, stage.power, first=k == 0)
                stage.consts[b.id]["transposed"] = b.id in transposed
        self._stages = stages

        groups = []
        for g in user_groups:
            opts = {k: g.get(k, lr if k == "lr" else getattr(cfg, k)) for k in GROUP_KEYS}
            cov = [(n, p) for n, p in g["params"] if n in covered]
            unc = [(n, p) for n, p in g["params"] if n not in covered]
            if cov:
                groups.append({"params": cov, "kind": "symo", "lr": opts["lr"], "beta1": opts["beta1"],
                               "nesterov": opts["nesterov"], "weight_decay": opts["weight_decay"]})
            if unc:
                groups.append({"params": unc, "kind": "adamw", "lr": opts["adamw_lr"],
                               "betas": tuple(opts["adamw_betas"]), "eps": opts["adamw_eps"],
                               "weight_decay": opts["adamw_wd"]})
        super().__init__(groups, {"lr": lr})
        self._ready = True
        self.assignment: dict[str, str] = {
            n: ("symo" if n in covered else "adamw") for g in self.param_groups for n in g["param_names"]}
        self._fast_fn: Callable | None = None

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Only at construction: the spec is compiled for the parameters given then."""
        if getattr(self, "_ready", False):
            raise NotImplementedError("Symo compiles its spec for the parameters given at construction; "
                                      "create a new optimizer to add parameters")
        super().add_param_group(param_group)

    # ------------------------------------------------------------------ reporting
    def describe(self) -> str:
        """Which parameters Symo preconditions (with their blocks) and which go to AdamW."""
        cfg = self.config
        sym = [n for n, k in self.assignment.items() if k == "symo"]
        adam = [n for n, k in self.assignment.items() if k == "adamw"]
        lines = [f"Symo: {len(sym)} parameters preconditioned by spec {self.compiled.name!r}"
                 + (f" # {self._stages[1].compiled.name!r}" if len(self._stages) > 1 else "")
                 + f", {len(adam)} to AdamW",
                 f"  beta1={cfg.beta1} nesterov={cfg.nesterov} beta2={cfg.beta2} source={cfg.source} "
                 f"estimator={cfg.estimator} power={cfg.power} damping={cfg.damping} ({cfg.damping_mode}) "
                 f"update_scale={cfg.update_scale} frequency={cfg.precondition_frequency}"
                 + ("" if cfg.muon_path else f" statistics={str(self._stats_dtype).removeprefix('torch.')}"),
                 "  " + self._preset_line()]
        lrs = sorted({g["lr"] for g in self.param_groups if g["kind"] == "symo"})
        lines.append(f"  learning rate {', '.join(f'{lr:g}' for lr in lrs)}; per block, lr_eff = lr x the RMS "
                     "per entry of the unit update when the statistic is this step's vector alone (the "
                     "averaged statistic gives at most about that): compare lr_eff with Adam's rate")
        device = next((p.device for g in self.param_groups if g["kind"] == "symo" for p in g["params"]),
                      torch.device("cpu"))
        lr = lrs[0] if lrs else 0.0
        for stage in self._stages:
            for b in stage.compiled.blocks:
                c = stage.consts[b.id]
                tag = f"[{stage.compiled.name}] " if len(self._stages) > 1 else ""
                backend = c["backend"]
                if backend == "newton_schulz" and cfg.muon_path:
                    backend += f" ({self._ns_method((b.mult, b.width), device)})"
                lines.append(f"  {tag}{b.id} {b.name}: Y {b.batch}x{b.mult}x{b.width}, "
                             f"d={b.dim}{_lr_eff(lr, self._unit_rms(b, c))}, backend={backend}; "
                             f"{summarize_names(b.params)}")
        adamw_lrs = sorted({g["lr"] for g in self.param_groups if g["kind"] == "adamw"})
        lines.append("  AdamW: " + (summarize_names(adam) + f" at its own rate adamw_lr="
                                    f"{', '.join(f'{x:g}' for x in adamw_lrs)} (not lr)" if adam else "(none)"))
        return fit_lines(lines)

    def _preset_line(self) -> str:
        """The preset (or the defaults) and every option that differs from it."""
        base = self._base_config
        word = "preset" if self.preset is not None else "default"
        diff = [f"{f.name}={getattr(self.config, f.name)!r} ({word}: {getattr(base, f.name)!r})"
                for f in fields(SymoConfig) if getattr(self.config, f.name) != getattr(base, f.name)]
        if self.preset is not None:
            head = f"preset {self.preset.name!r}: {self.preset.summary}"
        else:
            head = "no preset: the SymoConfig defaults (Muon's step at the natural scale; see symo.presets)"
        return head + ("; differs in " + ", ".join(diff) if diff else "; no option differs")

    def _unit_rms(self, b, c: dict[str, Any]) -> float | None:
        """RMS per entry of the block's update at lr 1 when S is this step's vector alone: S^{-1/2} Y =
        sqrt(d) polar(Y) has squared norm d * rank over mult * width entries (full rank: an upper bound).
        None where the update is not scale-free (a power other than -1/2, or a geometric mean)."""
        if self.config.update_scale == "adamw":
            return self.config.adamw_rms
        if len(self._stages) > 1 or self.config.power != -0.5:
            return None
        return c["scale"] * math.sqrt(c["dim"] * min(b.mult, b.width) / (b.mult * b.width))

    # ------------------------------------------------------------------ static per-block choices
    def _block_consts(self, b, power: float, first: bool) -> dict[str, Any]:
        cfg = self.config
        gram = min(b.mult, b.width) if cfg.muon_path else b.mult
        backend = cfg.backend
        if backend == "auto":
            backend = auto_backend(cfg, power, gram, self._device, self._stats_dtype)
        dim = max(b.dim, 1)
        scale = 1.0
        if cfg.update_scale == "natural":
            pass
        elif cfg.update_scale == "muon" or cfg.update_scale == "adamw":
            scale = dim ** power  # divide out the natural d^{-power}
            if first and cfg.update_scale == "muon":
                scale *= math.sqrt(max(1.0, b.width / b.mult))
        return {"dim": dim, "backend": backend, "scale": scale, "params": b.params,
                "dof": b.mult * dim, "where": f"block {b.id} ({b.name})"}

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimisation step; `closure` re-evaluates the loss (with grad enabled) and returns it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self.param_groups:
            for n, p in zip(g["param_names"], g["params"]):
                if p.grad is not None and p.grad.layout != torch.strided:
                    raise RuntimeError(f"Symo does not support sparse gradients (parameter {n!r}); use a dense "
                                       "gradient (e.g. nn.Embedding(..., sparse=False)) or torch.optim.SparseAdam")
        if self.config.check_finite:
            grads = {n: p.grad for g in self.param_groups for n, p in zip(g["param_names"], g["params"])
                     if p.grad is not None}
            check_finite_tensors(grads, list(grads))
        for group in self.param_groups:
            if group["kind"] == "adamw":
                self._adamw(group)
        self._symo([g for g in self.param_groups if g["kind"] == "symo"])
        return loss

    def _symo(self, groups: list[dict]) -> None:
        cfg = self.config
        names, params, grads, bufs, betas, nesterovs = [], [], [], [], [], []
        for group in groups:
            for n, p in zip(group["param_names"], group["params"]):
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=_stat_dtype(p.dtype))
                names.append(n)
                params.append(p)
                grads.append(p.grad)
                bufs.append(state["momentum_buffer"])
                betas.append(group["beta1"])
                nesterovs.append(group["nesterov"])
        if not names:
            return
        if cfg.muon_path:
            fn = _fast_directions_static
            if cfg.compile:
                if self._fast_fn is None:
                    self._fast_fn = torch.compile(_fast_directions_static, fullgraph=True)
                fn = self._fast_fn
            updates = fn(self, names, grads, bufs, tuple(betas), tuple(nesterovs))
        else:
            updates = self._general_directions(names, grads, bufs, betas, nesterovs)
        lookup = {id(p): g for g in groups for p in g["params"]}
        for n, p in zip(names, params):
            group = lookup[id(p)]
            if group["weight_decay"] != 0:
                p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(updates[n].to(p.dtype), alpha=-group["lr"])

    def _momentum(self, grads, bufs, betas, nesterovs) -> list[torch.Tensor]:
        us = []
        for g, buf, beta, nest in zip(grads, bufs, betas, nesterovs):
            g = g.to(buf.dtype)
            buf.lerp_(g, 1 - beta)
            us.append(g.lerp(buf, beta) if nest else buf)
        return us

    def _with_zeros(self, compiled: CompiledSpec, tensors: dict[str, torch.Tensor], like: torch.Tensor):
        """Covered parameters without a gradient this step count as zero in their blocks."""
        out = dict(tensors)
        for n in compiled.param_names:
            if n not in out:
                out[n] = torch.zeros(compiled.shapes[n], dtype=like.dtype, device=like.device)
        return out

    def _fast_block(self, y: torch.Tensor, ys: torch.Tensor, c: dict[str, Any]) -> torch.Tensor:
        """Single-statistic S^{power} applied to Y (ys: the statistic's coordinates, maybe Y itself)."""
        cfg = self.config
        absolute = cfg.damping_mode == "absolute"
        if ys is y:
            if c["backend"] == "newton_schulz":
                # batch 1 (a whole matrix): plain 2-D GEMMs, faster than bmm and rounding like Muon's
                y2 = y[0] if y.shape[0] == 1 else y
                if c["transposed"]:
                    # Y = G^T of one square matrix: iterate on G, as Muon does (the same map, rounded alike)
                    y2 = y2.transpose(-1, -2)
                if self._ns_method(y2.shape, y2.device) == "spectral":
                    z = newton_schulz_spectral(y2, cfg.ns_steps, cfg.ns_coeffs)
                    z = (z.transpose(-1, -2) if c["transposed"] else z).reshape(y.shape)
                else:
                    work = y2.to(torch.bfloat16) if cfg.ns_dtype == "bfloat16" else y2
                    z = newton_schulz(work, cfg.ns_steps, cfg.ns_coeffs).to(y.dtype)
                    z = (z.transpose(-1, -2) if c["transposed"] else z).reshape(y.shape)
                # sqrt(d) polar(Y) is the natural scale; fold it into the convention's factor
                return self._finish(z, c, last=True, extra=math.sqrt(c["dim"]))
            z = gram_power_apply(y, cfg.power, c["dim"], cfg.damping, absolute=absolute)
        else:  # a statistic other than Y (source="gradient"): formed and powered in stats_dtype
            sd = self._stats_dtype
            ys, y64 = ys.to(sd), y.to(sd)
            if ys.shape[-2] <= ys.shape[-1]:
                a = ys @ ys.transpose(-1, -2) / c["dim"]
                z = _matrix_power(a, cfg.power, cfg, c["backend"], c["where"]) @ y64
            else:
                z = lowrank_power_apply(ys / math.sqrt(c["dim"]), y64, cfg.power, cfg.damping, absolute=absolute)
            z = z.to(y.dtype)
        return self._finish(z, c, last=True)

    def _ns_method(self, shape: tuple[int, ...] | torch.Size, device: torch.device) -> str:
        """iterate or spectral for a Newton-Schulz call on a (..., m, n) block (see SymoConfig.ns_method)."""
        cfg = self.config
        if cfg.ns_method != "auto":
            return cfg.ns_method
        cheap = device.type == "cpu" and cfg.ns_dtype == "float32" and spectral_ns_is_cheaper(shape)
        return "spectral" if cheap else "iterate"

    def _finish(self, z: torch.Tensor, c: dict[str, Any], last: bool, extra: float = 1.0) -> torch.Tensor:
        scale = c["scale"] * extra
        z = z * scale if scale != 1.0 else z
        if last and self.config.update_scale == "adamw":
            rms = z.norm(dim=(-2, -1), keepdim=True) / math.sqrt(c["dof"])
            z = z * (self.config.adamw_rms / rms.clamp_min(1e-30))
        return z

    # ------------------------------------------------------------------ stored-statistics path
    def _general_directions(self, names, grads, bufs, betas, nesterovs) -> dict[str, torch.Tensor]:
        cfg = self.config
        us = dict(zip(names, self._momentum(grads, bufs, betas, nesterovs)))
        like = next(iter(us.values()))
        present = set(names)
        stats = us if cfg.source == "momentum" else {n: g.to(like.dtype) for n, g in zip(names, grads)}
        current = us
        for k, stage in enumerate(self._stages):
            comp = stage.compiled
            last = k == len(self._stages) - 1
            ys = comp.gather(self._with_zeros(comp, current, like))
            ss = comp.gather(self._with_zeros(comp, stats, like)) if stats is not current else ys
            sw = None
            if cfg.estimator == "taylor":
                w = {n: t.detach().to(like.dtype) for n, t in self._covered_weights(comp).items()}
                sw = comp.orbit_average(w, centered=True, check_finite=False)
            zs = {}
            for b in comp.blocks:
                c = stage.consts[b.id]
                if present.isdisjoint(c["params"]):
                    zs[b.id] = torch.zeros_like(ys[b.id])
                    continue
                z = self._stored_block(stage, b, ys[b.id], ss[b.id], sw)
                zs[b.id] = self._finish(z, c, last)
            current = comp.scatter(zs)
        return current

    def _covered_weights(self, comp: CompiledSpec) -> dict[str, torch.Tensor]:
        out = {}
        for g in self.param_groups:
            for n, p in zip(g["param_names"], g["params"]):
                if n in comp.shapes:
                    out[n] = p
        return out

    def _stored_block(self, stage: _Stage, b, y: torch.Tensor, ys: torch.Tensor, sw) -> torch.Tensor:
        """EMA the block statistic, refresh its matrix function every `precondition_frequency` steps.

        The statistic, its EMA and its matrix function live in `stats_dtype` (float64 by default:
        the products of float32 coordinates are then exact and no direction is lost to rounding)."""
        cfg = self.config
        c = stage.consts[b.id]
        st = self.state[stage.key].setdefault(b.id, {"step": 0})
        ys = ys.to(self._stats_dtype)
        stat = ys @ ys.transpose(-1, -2) / c["dim"]
        if cfg.beta2 == 0.0:
            ema = stat
        elif "ema" not in st:
            st["ema"] = stat if cfg.beta2 == 1.0 else stat * (1 - cfg.beta2)
            ema = st["ema"]
        else:
            ema = st["ema"]
            if cfg.beta2 == 1.0:
                ema.add_(stat)
            else:
                ema.mul_(cfg.beta2).add_(stat, alpha=1 - cfg.beta2)
        st["step"] += 1
        if (st["step"] - 1) % cfg.precondition_frequency == 0 or "precond" not in st:
            a = ema / (1 - cfg.beta2 ** st["step"]) if 0.0 < cfg.beta2 < 1.0 else ema
            if cfg.estimator == "taylor" and b.id in (sw.dense_factors.keys() | sw.root_factors.keys()):
                st["precond"] = self._taylor(a, sw.factor(b.id).to(a.dtype), stage.power)
            else:
                st["precond"] = _matrix_power(a, stage.power, cfg, c["backend"], c["where"])
        return (st["precond"] @ y.to(st["precond"].dtype)).to(y.dtype)

    def _taylor(self, sg: torch.Tensor, sw: torch.Tensor, power: float) -> torch.Tensor:
        """H = S_w^{-1} # S_g (solves H S_w H = S_g), then H^{2 power}; S_w is fully damped first."""
        cfg = self.config
        eye = torch.eye(sw.shape[-1], dtype=sw.dtype, device=sw.device)
        delta = max(cfg.damping, 1e-8)
        if cfg.damping_mode == "relative":
            delta = delta * torch.linalg.matrix_norm(sw, ord=2, keepdim=True).clamp_min(1e-30)
        h = geometric_mean(sym_power(sw + delta * eye, -1.0), sg)
        evals, evecs = torch.linalg.eigh(((h + h.transpose(-1, -2)) / 2).double())
        # H is a square root of S_g-like data: rounding zeros of S_g come out at sqrt(eps) * lambda_max
        lam = evals.amax(-1, keepdim=True).clamp_min(0)
        keep = evals > lam * math.sqrt(h.shape[-1] * torch.finfo(sg.dtype).eps)
        shift = cfg.damping if cfg.damping_mode == "absolute" else cfg.damping * lam
        f = torch.where(keep, (evals.clamp_min(0) + shift).pow(2 * power), torch.zeros_like(evals))
        return ((evecs * f.unsqueeze(-2)) @ evecs.transpose(-1, -2)).to(sg.dtype)

    # ------------------------------------------------------------------ AdamW for uncovered params
    def _adamw(self, group: dict) -> None:
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self.state[p]
            if "step" not in st:
                dt = _stat_dtype(p.dtype)
                st["step"] = torch.zeros((), dtype=torch.float32)
                st["exp_avg"] = torch.zeros_like(p, dtype=dt)
                st["exp_avg_sq"] = torch.zeros_like(p, dtype=dt)
            st["step"] += 1
            t = float(st["step"])
            # the same operations, in the same order, as torch.optim.AdamW (single-tensor path)
            if group["weight_decay"] != 0:
                p.mul_(1 - group["lr"] * group["weight_decay"])
            g = p.grad.to(st["exp_avg"].dtype)
            st["exp_avg"].lerp_(g, 1 - beta1)
            st["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            step_size = group["lr"] / (1 - beta1 ** t)
            denom = (st["exp_avg_sq"].sqrt() / (1 - beta2 ** t) ** 0.5).add_(group["eps"])
            if p.dtype == denom.dtype:
                p.addcdiv_(st["exp_avg"], denom, value=-step_size)
            else:
                p.add_((st["exp_avg"] / denom).to(p.dtype), alpha=-step_size)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus "symo": the spec key, sizes and stages it was saved for, so
        `load_state_dict` can refuse a checkpoint of another spec, width or parameter set."""
        out = super().state_dict()
        out["symo"] = {"spec": self.compiled.name, "keys": [st.compiled.key for st in self._stages],
                       "sizes": [dict(st.compiled.sizes) for st in self._stages]}
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, plus the block statistics (plain tensors keyed by block id): copied to the
        parameters' device so the loaded optimizer owns them. The checkpoint is checked first
        against this optimizer's spec, widths and parameters (ValueError naming what differs)."""
        _check_state_dict(self, state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)
        # torch casts per-parameter state to the parameter's dtype (bf16 momentum!) and keeps `step`
        # shared with the loaded dict: restore the saved dtypes, as private copies.
        for i, p in zip(saved_ids, (p for g in self.param_groups for p in g["params"])):
            for k, v in state_dict["state"].get(i, {}).items():
                if torch.is_tensor(v):
                    self.state[p][k] = v.to(device=v.device if k == "step" else p.device, copy=True)
        device = next(p.device for g in self.param_groups for p in g["params"])
        for stage in self._stages:
            blocks = self.state.get(stage.key)
            if blocks:
                self.state[stage.key] = {b: {k: (v.to(device, copy=True) if torch.is_tensor(v) else v)
                                             for k, v in st.items()} for b, st in blocks.items()}

    def memory_report(self) -> dict[str, int]:
        """State numbers this optimizer keeps, analytically, against AdamW on every parameter and
        against Shampoo's two factors per matrix (what `symo compile --optimizer` prints)."""
        numel = {n: p.numel() for g in self.param_groups for n, p in zip(g["param_names"], g["params"])}
        shapes = {n: tuple(p.shape) for g in self.param_groups for n, p in zip(g["param_names"], g["params"])}
        covered = [n for n, k in self.assignment.items() if k == "symo"]
        stats = 0
        if not self.config.muon_path:  # an EMA and its matrix function per block
            stats = sum(2 * b.batch * b.mult * b.mult for st in self._stages for b in st.compiled.blocks)
        adamw_part = sum(2 * numel[n] for n, k in self.assignment.items() if k == "adamw")
        return {
            "symo": sum(numel[n] for n in covered) + stats + adamw_part,
            "symo_block_statistics": stats,
            "adamw": 2 * sum(numel.values()),
            "shampoo": sum(sum(d * d for d in shapes[n]) for n in covered) + adamw_part,
        }

    def state_bytes(self) -> int:
        """Bytes held in optimizer state tensors (momentum, AdamW moments, block statistics)."""
        total = 0
        for v in self.state.values():
            for t in _tensors(v):
                total += t.numel() * t.element_size()
        return total


def _fast_directions_static(opt: Symo, names, grads, bufs, betas, nesterovs) -> dict[str, torch.Tensor]:
    """Muon path, Python control flow static in the shapes and config: momentum, Y, polar, scatter."""
    us = dict(zip(names, opt._momentum(grads, bufs, betas, nesterovs)))
    comp = opt.compiled
    full = opt._with_zeros(comp, us, bufs[0]) if len(us) < len(comp.param_names) else us
    ys = comp.gather(full)
    if opt.config.source == "gradient":
        gs = {n: g.to(bufs[0].dtype) for n, g in zip(names, grads)}
        ss = comp.gather(opt._with_zeros(comp, gs, bufs[0]) if len(gs) < len(comp.param_names) else gs)
    else:
        ss = ys
    consts = opt._stages[0].consts
    present = set(names)
    zs = {}
    groups: dict[tuple, list[str]] = {}  # same shape and constants -> one batched call
    batch = _stack_blocks(opt.config, bufs[0].device)
    for b in comp.blocks:
        c = consts[b.id]
        if present.isdisjoint(c["params"]):
            zs[b.id] = torch.zeros_like(ys[b.id])
        elif batch:
            key = (tuple(ys[b.id].shape), tuple(ss[b.id].shape), c["dim"], c["backend"], c["scale"], c["dof"],
                   c["transposed"])
            groups.setdefault(key, []).append(b.id)
        else:
            zs[b.id] = opt._fast_block(ys[b.id], ss[b.id], c)
    for ids in groups.values():
        c = consts[ids[0]]
        if len(ids) == 1:
            zs[ids[0]] = opt._fast_block(ys[ids[0]], ss[ids[0]], c)
            continue
        # blocks are (batch, mult, width) and every matrix function acts per batch element, so
        # stacking along the batch axis computes the same thing in one call
        y = torch.cat([ys[i] for i in ids])
        s = y if ss is ys else torch.cat([ss[i] for i in ids])
        for i, z in zip(ids, opt._fast_block(y, s, c).split([ys[i].shape[0] for i in ids])):
            zs[i] = z
    return comp.scatter(zs)


def _square_transposed_blocks(comp: CompiledSpec) -> set[str]:
    """Blocks whose Y is the transpose of one square 2-D parameter (batch 1), found by gathering a
    probe: Newton-Schulz then iterates on the parameter's own orientation, as Muon does."""
    candidates = {b.id: b.params[0] for b in comp.blocks
                  if b.batch == 1 and len(b.params) == 1 and b.mult == b.width
                  and comp.shapes[b.params[0]] == (b.mult, b.width)}
    if not candidates:
        return set()
    # one probe for all candidates: each holds its own parameter, so its block sees only that one
    probe = {n: torch.zeros(s, dtype=torch.float64) for n, s in comp.shapes.items()}
    for name in candidates.values():
        probe[name] = torch.arange(probe[name].numel(), dtype=torch.float64).reshape(probe[name].shape)
    ys = comp.gather(probe)
    return {bid for bid, name in candidates.items() if torch.equal(ys[bid][0], probe[name].T)}


def _stack_blocks(cfg: SymoConfig, device: torch.device) -> bool:
    """Whether the Muon path stacks same-shape blocks into one call (SymoConfig.batch_blocks)."""
    return device.type != "cpu" if cfg.batch_blocks == "auto" else cfg.batch_blocks


def _matrix_power(a: torch.Tensor, power: float, cfg: SymoConfig, backend: str, where: str) -> torch.Tensor:
    """A^power of a stored statistic by the block's backend, never diverging.

    The coupled Newton–Schulz iteration runs only where its damping makes it accurate (it cannot form
    a pseudo-inverse); eigh elsewhere. A non-finite result is retried by a float64 eigh; if that too
    is non-finite, NonFiniteUpdateError names the block and the backend."""
    absolute = cfg.damping_mode == "absolute"
    if backend == "newton_schulz" and ns_inverse_root_is_accurate(a, cfg.ns_inverse_steps, cfg.damping, absolute):
        out = inv_sqrt_newton_schulz(a, cfg.ns_inverse_steps, cfg.damping, absolute=absolute)
    else:
        out = sym_power(a, power, cfg.damping, FLOAT64_EIGH_MAX, absolute=absolute)
    if bool(torch.isfinite(out).all()):
        return out
    if bool(torch.isfinite(a).all()):
        out = sym_power(a.to(torch.float64), power, cfg.damping, FLOAT64_EIGH_MAX, absolute=absolute).to(a.dtype)
        if bool(torch.isfinite(out).all()):
            return out
    raise NonFiniteUpdateError(
        f"Symo's curvature power for {where} came out NaN/inf (backend {backend}, statistic dtype {a.dtype}, "
        f"statistic {'finite' if bool(torch.isfinite(a).all()) else 'non-finite'}) although the gradients were "
        "finite; this is the optimizer's numerics, not your gradient: use stats_dtype='float64' and "
        "backend='eigh', or add damping")


def auto_backend(cfg: SymoConfig, power: float, gram: int, device: torch.device, stats_dtype: torch.dtype) -> str:
    """backend="auto" for one block: "newton_schulz" or "eigh" (SymoConfig.backend).

    Muon path: Muon's quintic for Gram sides above eigh_max_size. Stored statistics: the coupled
    inverse-root iteration only where it is both cheaper (an accelerator; on CPU a float64 eigh is
    4-15x cheaper at every size) and accurate (relative damping at or above its floor)."""
    large = power == -0.5 and gram > cfg.eigh_max_size
    if not cfg.muon_path:
        large = large and device.type != "cpu" and cfg.damping_mode == "relative" and (
            cfg.damping >= ns_inverse_root_min_damping(cfg.ns_inverse_steps, stats_dtype))
    return "newton_schulz" if large else "eigh"


def _lr_eff(lr: float, unit: float | None) -> str:
    return "" if unit is None else f", lr_eff={lr * unit:.3g}"


def _resolve_stats_dtype(choice: str, device: torch.device) -> torch.dtype:
    """SymoConfig.stats_dtype -> the dtype of stored statistics and their matrix functions."""
    if choice == "float64" or (choice == "auto" and device.type != "mps"):
        return torch.float64
    return torch.float32


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics and momentum in float32 at least (bfloat16 / float16 parameters)."""
    return torch.promote_types(dtype, torch.float32)


def _tensors(v: Any) -> Iterable[torch.Tensor]:
    if torch.is_tensor(v):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from _tensors(x)


def _compile(spec: SpecLike, shapes: dict[str, tuple[int, ...]], sizes: dict[str, int] | None,
             strict: bool = True) -> CompiledSpec:
    if isinstance(spec, CompiledSpec):
        bad = {n: (s, shapes.get(n)) for n, s in spec.shapes.items() if shapes.get(n, s) != s}
        if bad:
            raise ValueError(f"the CompiledSpec was compiled for other shapes: {bad} (compiled, given)")
        return spec
    from .runtime.compiled import compile as symo_compile

    return symo_compile(spec, shapes, sizes=sizes, strict=strict)


def _normalise_groups(params: NamedParams) -> list[dict[str, Any]]:
    """-> [{"params": [(name, tensor), ...], **options}], rejecting unnamed tensors."""
    if torch.is_tensor(params) or isinstance(params, (str, bytes)) or not isinstance(params, (Iterable, Mapping)):
        raise TypeError("params must be named parameters: model.named_parameters(), a {name: param} dict or "
                        f"param groups; got {type(params).__name__}")
    if isinstance(params, Mapping):
        params = list(params.items())
    params = list(params)
    if not params:
        raise ValueError("Symo got an empty parameter list")
    groups = params if isinstance(params[0], dict) else [{"params": params}]
    out, seen = [], set()
    for g in groups:
        if not isinstance(g, dict):
            raise TypeError("mix of param-group dicts and (name, param) pairs")
        unknown = set(g) - {"params", *GROUP_KEYS}
        if unknown:
            raise ValueError(f"unknown param-group option(s) {sorted(unknown)}; per-group options are "
                             f"{GROUP_KEYS} (curvature options are global: SymoConfig)")
        if "params" not in g:
            raise ValueError("a param group needs a 'params' entry: {'params': [(name, param), ...], ...}")
        items = g["params"]
        if torch.is_tensor(items) or not isinstance(items, (Iterable, Mapping)):
            raise TypeError(f"a param group's 'params' must be [(name, param), ...], got {type(items).__name__}")
        items = list(items.items()) if isinstance(items, Mapping) else list(items)
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise TypeError("Symo needs named parameters: pass model.named_parameters() or groups "
                                "with 'params': [(name, param), ...]")
            if item[0] in seen:
                raise ValueError(f"parameter {item[0]!r} given twice")
            seen.add(item[0])
        out.append({**g, "params": items})
    return out


__all__ = ["GROUP_KEYS", "Symo", "SymoConfig"]
