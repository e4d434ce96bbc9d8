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
smaller Gram side's eigh. Uncovered parameters (embeddings, gains, biases) get the built-in AdamW.

The units this file reads from: the block plan (plan.py), the stored statistics (statistics.py), the
matrix-function backends (matrix_functions.py), the AdamW fallback (adamw.py), the options (config.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ..compiler import Spec
from ..runtime.compiled import CompiledSpec, check_finite_tensors, compile_for
from . import report, state
from .adamw import adamw_step, moment_dtype
from .checks import GROUP_KEYS, NamedParams, check_group_options, check_state_dict, normalise_groups
from .config import FEATURES, FLAT, SymoConfig
from .distributed import Distributor, distribute, zeros_like_param
from .matrix_functions import finish, single_statistic_apply, stored_power, taylor_power
from .plan import Stage, build_stages, resolve_stats_dtype, stack_blocks
from .presets import get_preset
from .statistics import update_statistic

SpecLike = str | Path | Spec | CompiledSpec


class Symo(torch.optim.Optimizer):
    """Symmetry-structured preconditioning: the spec's commutant curvature, per isotypic block.

    Args:
        params: named parameters (`model.named_parameters()`, a {name: param} dict) or param groups:
            dicts with "params": [(name, param), ...] plus any of `GROUP_KEYS`.
        spec: a spec path, a parsed `Spec`, or a `CompiledSpec` (compiled here for the given shapes).
        lr: learning rate of the covered parameters (see `SymoConfig.update_scale` for its scale);
            None: the preset's recommended rate, or 1e-3 without a preset.
        config: a `SymoConfig`; keyword `overrides` (flat option names, or feature configs such as
            `matrix_function=MatrixFunctionConfig(...)`) replace its values.
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
        unknown = sorted(set(overrides) - set(FLAT) - set(FEATURES))
        if unknown:
            raise TypeError(f"Symo got unknown option(s) {unknown}; the options are the fields of SymoConfig")
        self.preset = None if preset is None else get_preset(preset)
        if self.preset is not None and config is not None:
            raise ValueError(f"pass preset={preset!r} or config=, not both; override a preset's values by "
                             "keyword, e.g. Symo(params, spec, preset='paper', beta2=0.99)")
        if lr is None:
            lr = self.preset.lr if self.preset is not None else 1e-3
        # what describe() compares against: the preset, or the documented defaults
        self.base_config = SymoConfig(**self.preset.values) if self.preset is not None else SymoConfig()
        self.config = cfg = (config or self.base_config).replace(**overrides)
        if sizes is not None and not isinstance(sizes, Mapping):
            raise TypeError(f"sizes must be a dict {{space: int}}, got {type(sizes).__name__}")
        if not isinstance(spec, (str, Path, Spec, CompiledSpec)):
            raise TypeError(f"spec must be a path, a bundled spec name, a Spec or a CompiledSpec, got "
                            f"{type(spec).__name__}")
        user_groups = normalise_groups(params)
        for gi, g in enumerate(user_groups):  # before compiling: a bad option fails fast
            check_group_options({k: g.get(k, lr if k == "lr" else getattr(cfg, k)) for k in GROUP_KEYS},
                                "" if len(user_groups) == 1 else f"param group {gi}: ")
        named = {n: p for g in user_groups for n, p in g["params"]}
        shapes = {n: tuple(p.shape) for n, p in named.items()}
        device = next(iter(named.values())).device
        self.stats_dtype = resolve_stats_dtype(cfg.stats_dtype, device)
        self.compiled = compile_for(spec, shapes, sizes, strict)
        covered = set(self.compiled.param_names)
        missing = sorted(covered - set(named))
        if missing:
            raise ValueError(f"the spec covers parameters that were not given to the optimizer: {missing}")
        second = None
        if cfg.geometric_mean_with is not None:
            second = compile_for(cfg.geometric_mean_with, shapes, sizes, strict)
            if set(second.param_names) != covered:
                raise ValueError("geometric_mean_with: both specs must cover the same parameters; "
                                 f"they differ on {sorted(covered ^ set(second.param_names))}")
        self.plan: list[Stage] = build_stages(self.compiled, second, cfg, device, self.stats_dtype)

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
        self._compiled_directions: Callable | None = None
        self.distributor: Distributor | None  # None in one process
        self.distributor, self.anchors = distribute(cfg.distributed, cfg.estimator, self.plan, named)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Only at construction: the spec is compiled for the parameters given then."""
        if getattr(self, "_ready", False):
            raise NotImplementedError("Symo compiles its spec for the parameters given at construction; "
                                      "create a new optimizer to add parameters")
        super().add_param_group(param_group)

    def describe(self) -> str:
        """Which parameters Symo preconditions (with their blocks) and which go to AdamW."""
        return report.describe(self)

    def memory_report(self) -> dict[str, int]:
        """State numbers this optimizer keeps, against AdamW and Shampoo (see symo.optim.report)."""
        return report.memory_report(self)

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimisation step; `closure` re-evaluates the loss (with grad enabled) and returns it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = {n: p.grad for g in self.param_groups for n, p in zip(g["param_names"], g["params"])
                 if p.grad is not None}
        for n, grad in grads.items():
            if grad.layout != torch.strided:
                raise RuntimeError(f"Symo does not support sparse gradients (parameter {n!r}); use a dense "
                                   "gradient (e.g. nn.Embedding(..., sparse=False)) or torch.optim.SparseAdam")
        d = self.distributor
        if d is not None:
            d.counters.update(collectives=0, bytes=0)
        if self.config.check_finite:
            d.check_finite(grads) if d is not None else check_finite_tensors(grads, list(grads))
        for group in self.param_groups:
            if group["kind"] == "adamw":  # elementwise: each rank steps its own shards
                adamw_step(group, self.state, *(() if d is None else (d.local,)))
        self._step_covered([g for g in self.param_groups if g["kind"] == "symo"])
        return loss

    def _step_covered(self, groups: list[dict]) -> None:
        """Gradients -> momentum -> block coordinates -> matrix function -> scatter -> parameter update."""
        names, params, grads, bufs, betas, nesterovs = [], [], [], [], [], []
        local = (lambda t: t) if self.distributor is None else self.distributor.local  # a shard's own part
        for group in groups:
            for n, p in zip(group["param_names"], group["params"]):
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=moment_dtype(p.dtype))
                names.append(n)
                params.append(p)
                grads.append(local(p.grad))
                bufs.append(local(state["momentum_buffer"]))
                betas.append(group["beta1"])
                nesterovs.append(group["nesterov"])
        if not names:
            return
        if self.distributor is not None:  # momentum here, the rest on each component's owner
            us = dict(zip(names, momentum(grads, bufs, betas, nesterovs)))
            gs = dict(zip(names, grads)) if self.config.source == "gradient" else None
            owned = self.distributor.owned
            updates = self.distributor.directions(names, us, gs,
                                                  lambda fu, fg: self._directions(names, fu, fg, owned))
        elif self.config.muon_path:  # one statistic, used at once: nothing stored per block
            fn = muon_path_directions
            if self.config.compile:
                if self._compiled_directions is None:
                    self._compiled_directions = torch.compile(muon_path_directions, fullgraph=True)
                fn = self._compiled_directions
            updates = fn(self.plan[0], self.config, self.stats_dtype, names, grads, bufs, tuple(betas),
                         tuple(nesterovs))
        else:
            us = dict(zip(names, momentum(grads, bufs, betas, nesterovs)))
            updates = self._averaged_directions(names, us, dict(zip(names, grads)), None)
        lookup = {id(p): g for g in groups for p in g["params"]}
        for n, p in zip(names, params):
            group = lookup[id(p)]
            target = local(p)
            if group["weight_decay"] != 0:
                target.mul_(1 - group["lr"] * group["weight_decay"])
            target.add_(updates[n].to(p.dtype), alpha=-group["lr"])

    def _directions(self, names: list[str], us: dict[str, torch.Tensor], grads: dict[str, torch.Tensor] | None,
                    owned: list[set[str]]) -> dict[str, torch.Tensor]:
        """An owner's part: `us` (and `grads`) are the whole tensors of the present parameters it owns,
        `names` every present parameter; only the blocks in `owned` (per stage) are computed."""
        if self.config.muon_path:
            return muon_directions(self.plan[0], self.config, self.stats_dtype, names, us, grads, owned[0])
        return self._averaged_directions(names, us, grads, owned)

    def _averaged_directions(self, names: list[str], us: dict[str, torch.Tensor],
                             grads: dict[str, torch.Tensor] | None,
                             owned: list[set[str]] | None) -> dict[str, torch.Tensor]:
        """Stored statistics: each block's average A is updated, its A^{power} refreshed when due, and
        applied to the block's coordinates; a geometric mean applies its stages one after the other.
        `owned` (several processes): per stage, the blocks computed here; the others stay zero."""
        cfg = self.config
        like = next(iter(us.values()))
        present = set(names)
        stats = us if cfg.source == "momentum" else {n: g.to(like.dtype) for n, g in grads.items()}
        current = us
        for k, stage in enumerate(self.plan):
            comp = stage.compiled
            ys = comp.gather(with_zeros(comp, current, like))
            ss = comp.gather(with_zeros(comp, stats, like)) if stats is not current else ys
            sw = None
            if cfg.estimator == "taylor":
                w = {n: p.detach().to(like.dtype) for g in self.param_groups
                     for n, p in zip(g["param_names"], g["params"]) if n in comp.shapes}
                sw = comp.orbit_average(w, centered=True, check_finite=False)
            zs = {}
            for b in comp.blocks:
                c = stage.blocks[b.id]
                if present.isdisjoint(c.params) or (owned is not None and b.id not in owned[k]):
                    zs[b.id] = torch.zeros_like(ys[b.id])
                    continue
                st = state.block_state(self, k, stage, b.id)
                average, due = update_statistic(st, ss[b.id], c.dim, cfg, self.stats_dtype)
                if due and sw is not None and b.id in (sw.dense_factors.keys() | sw.root_factors.keys()):
                    st["precond"] = taylor_power(average, sw.factor(b.id).to(average.dtype), stage.power,
                                                 cfg.damping, cfg.damping_mode == "absolute")
                elif due:
                    st["precond"] = stored_power(average, stage.power, cfg, c.backend, c.where)
                y = ys[b.id]
                z = (st["precond"] @ y.to(st["precond"].dtype)).to(y.dtype)
                zs[b.id] = finish(z, c, cfg, last=k == len(self.plan) - 1)
            current = comp.scatter(zs)
        return current

    # ------------------------------------------------------------------ state (symo.optim.state)
    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus "symo": the spec key, sizes and stages it was saved for, so
        `load_state_dict` can refuse a checkpoint of another spec, width or parameter set."""
        return {**super().state_dict(), "symo": state.checkpoint_meta(self.plan)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, plus the block statistics (plain tensors keyed by block id): copied to the
        parameters' device so the loaded optimizer owns them. The checkpoint is checked first
        against this optimizer's spec, widths and parameters (ValueError naming what differs)."""
        check_state_dict(state_dict, self.plan, self.param_groups)
        super().load_state_dict(state_dict)
        state.own_loaded_state(self, state_dict)

    def full_state_dict(self) -> dict[str, Any]:
        """The state consolidated, on every rank: sharded state gathered into whole tensors and every
        owner's block statistics under the stages' keys (collective: every rank calls it). What a rank-0
        `torch.save` checkpoint needs; `load_state_dict` takes it on any number of ranks."""
        return {**state.consolidated_state_dict(self), "symo": state.checkpoint_meta(self.plan)}

    def block_statistics(self, key: str = "symo_blocks") -> dict[str, dict[str, Any]]:
        """{block id: {"step", "ema", "precond"}} of the stored statistics ("symo_gm_blocks": a geometric
        mean's second spec); with several processes, the blocks this rank owns."""
        return state.block_statistics(self, key)

    def state_bytes(self) -> int:
        """Bytes held in optimizer state tensors (momentum, AdamW moments, block statistics)."""
        return state.state_bytes(self.state)


def momentum(grads, bufs, betas, nesterovs) -> list[torch.Tensor]:
    """Muon's momentum in place on `bufs`; returns the vectors to precondition (Nesterov blend or m)."""
    us = []
    for g, buf, beta, nest in zip(grads, bufs, betas, nesterovs):
        g = g.to(buf.dtype)
        buf.lerp_(g, 1 - beta)
        us.append(g.lerp(buf, beta) if nest else buf)
    return us


def with_zeros(compiled: CompiledSpec, tensors: dict[str, torch.Tensor], like: torch.Tensor) -> dict:
    """Covered parameters without a gradient this step count as zero in their blocks."""
    if len(tensors) == len(compiled.param_names):
        return tensors
    out = dict(tensors)
    for n in compiled.param_names:
        if n not in out:
            out[n] = zeros_like_param(compiled.shapes[n], like)
    return out


def muon_path_directions(stage: Stage, cfg: SymoConfig, stats_dtype: torch.dtype, names, grads, bufs,
                         betas, nesterovs) -> dict[str, torch.Tensor]:
    """The Muon path, Python control flow static in the shapes and config (so torch.compile takes it
    whole): momentum, block coordinates Y, S^{power} Y with S this step's statistic, scatter."""
    us = dict(zip(names, momentum(grads, bufs, betas, nesterovs)))
    gs = dict(zip(names, grads)) if cfg.source == "gradient" else None
    return muon_directions(stage, cfg, stats_dtype, names, us, gs, None)


def muon_directions(stage: Stage, cfg: SymoConfig, stats_dtype: torch.dtype, names: list[str],
                    us: dict[str, torch.Tensor], grads: dict[str, torch.Tensor] | None,
                    owned: set[str] | None) -> dict[str, torch.Tensor]:
    """The Muon path after momentum: `us` the vectors to precondition, `grads` for source="gradient",
    `names` the parameters with a gradient; `owned` (several processes): the blocks computed here."""
    like = next(iter(us.values()))
    comp = stage.compiled
    ys = comp.gather(with_zeros(comp, us, like))
    if cfg.source == "gradient":
        ss = comp.gather(with_zeros(comp, {n: g.to(like.dtype) for n, g in grads.items()}, like))
    else:
        ss = ys
    present = set(names)
    zs = {}
    groups: dict[tuple, list[str]] = {}  # same shape and constants -> one batched call
    batch = stack_blocks(cfg, like.device)
    for b in comp.blocks:
        c = stage.blocks[b.id]
        if present.isdisjoint(c.params) or (owned is not None and b.id not in owned):
            zs[b.id] = torch.zeros_like(ys[b.id])
        elif batch:
            key = (tuple(ys[b.id].shape), tuple(ss[b.id].shape), c.dim, c.backend, c.scale, c.dof, c.transposed)
            groups.setdefault(key, []).append(b.id)
        else:
            zs[b.id] = single_statistic_apply(ys[b.id], ss[b.id], c, cfg, stats_dtype)
    for ids in groups.values():
        c = stage.blocks[ids[0]]
        if len(ids) == 1:
            zs[ids[0]] = single_statistic_apply(ys[ids[0]], ss[ids[0]], c, cfg, stats_dtype)
            continue
        # blocks are (batch, mult, width) and every matrix function acts per batch element, so
        # stacking along the batch axis computes the same thing in one call
        y = torch.cat([ys[i] for i in ids])
        s = y if ss is ys else torch.cat([ss[i] for i in ids])
        for i, z in zip(ids, single_statistic_apply(y, s, c, cfg, stats_dtype).split([ys[i].shape[0] for i in ids])):
            zs[i] = z
    return comp.scatter(zs)
