"""`Symo`: a torch optimizer whose preconditioner is built from the spec's orbit-averaged curvature (docs/theory.md).

    model = symo.models.gpt_bench()
    opt = symo.Symo(model, preset="muon")      # the spec inferred from the model: its Muon-style relaxation
    opt = symo.Symo(model.named_parameters(), "gpt_muon", lr=0.02, update_scale="muon")   # a spec of your choice
    print(opt.describe())                      # which parameters are preconditioned, which go to AdamW

Per step, for the parameters the spec covers:

    m  <- beta1 m + (1 - beta1) g          (Muon's lerp form; u = the Nesterov blend, or m)
    for each pass the preconditioner kind asks for:
        Y = the block coordinates of u (and of the other vectors it carries) in one stage's spec
        the kind folds this step's statistics and refreshes its due factors (first visit of the stage),
        then maps every block's Y to its new coordinates; the result is scattered back
    w  <- (1 - lr wd) w - lr * direction

The momentum and the loop are functions of the tensors in symo/optim/step.py; the kinds live in
symo/optim/kinds/ (polar: Muon's step, the default; root, taylor, published, eigen_adam, then_orthogonalize).
Uncovered parameters (embeddings, gains, biases) get the built-in AdamW. Under several processes the vectors go
to each block's owner rank first (`Distributor.to_owners`) and the directions come back (`from_owners`), around
the same loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..compiler import Spec
from ..runtime.compiled import CompiledSpec, check_finite_tensors
from ..runtime.text import fit_lines
from . import auto_spec, neuron_norm, parameter_rms, report, state
from .adamw import adamw_step, moment_dtype
from .checks import GROUP_KEYS, NamedParams, check_group_options, check_state_dict, normalise_groups
from .config import ADAMW_LR, SymoConfig
from .distributed import Distributor, distribute
from .kinds import KINDS
from .kinds.base import Kind, StepContext
from .plan import Stage, build_stages, compile_subset, resolve_stats_dtype
from .presets import Preset, get_preset
from .step import check_finite_updates, directions, momentum, polar_step, shared_beta1

SpecLike = str | Path | Spec | CompiledSpec
# without a preset, the documented rate of each update scale: 1e-3 natural (a full-rank block moves 1e-3 RMS
# per entry, as Adam's rate does), Muon's 0.02 at Muon's scale, AdamW's 3e-3 when blocks match AdamW's RMS
DEFAULT_LR = {"natural": 1e-3, "muon": 0.02, "adamw": ADAMW_LR}


def documented_lr(preset: Preset | None, update_scale: str) -> float:
    """The preset's rate, or without a preset the documented rate of the update scale."""
    return preset.lr if preset is not None else DEFAULT_LR[update_scale]


def _is_number(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) or (torch.is_tensor(x) and x.numel() == 1)


class Symo(torch.optim.Optimizer):
    """Symmetry-structured preconditioning: the spec's commutant curvature, per isotypic block.

    Args:
        params: the `nn.Module` itself (its `named_parameters()`), named parameters (`model.named_parameters()`,
            a {name: param} dict) or param groups: dicts with "params": [(name, param), ...] plus any of
            `GROUP_KEYS`.
        spec: a spec path or bundled name, a parsed `Spec`, or a `CompiledSpec` (compiled here for the shapes).
            None (only with a module): the Muon-style relaxation inferred from the module
            (`symo.infer.training_spec`, what `symo infer --relax muon` writes), the spec that trains best in
            our measurements; `describe()` says so. `Symo(model, preset="muon")` is the one-line start.
        example_inputs: inputs of the module's forward for that inference (a tensor, a tuple, a dict or
            (args, kwargs)); None guesses them (symo.infer.default_example_inputs). Only without a spec.
        lr: learning rate of the covered parameters (see `UpdateConfig.update_scale` for its scale);
            None: the preset's recommended rate, or 1e-3 without a preset, at the default natural scale (a
            full-rank block moves 1e-3 RMS per entry, as Adam's rate does). `symo train`'s default 0.02 is at
            update_scale="muon", lr / sqrt(cols) per entry: 1.8e-3 on its 128-wide GPT.
        config: a `SymoConfig`; keyword `overrides` (flat option names, feature configs such as
            `momentum=MomentumConfig(...)`, or `preconditioner=` a kind name or its config) replace its values.
        preset: a name of `symo.PRESETS` ("published", "notebook", "muon", "shampoo", "eigen_adam",
            "then_orthogonalize", "soap", "soap_heavyball"): start from that configuration instead of the
            SymoConfig defaults; keyword `overrides` replace its values. Not with `config`.
        sizes: space sizes the shapes cannot decide (as in `symo.compile`).
        strict: False lets the spec cover more parameters than are given (fine-tuning a subset, frozen
            parameters left out): its entries for absent parameters are dropped, as
            `symo.compile(..., strict=False)` does. None (the default): the same, with a warning naming the
            first dropped rule; True: an error.

    Each user group becomes up to two torch param groups, `kind` "symo" (covered) and "adamw"
    (uncovered, with "lr" = adamw_lr), so schedulers, `zero_grad` and `state_dict` act on both; each torch
    group's "user_group" is the index of the group it came from (`describe()` shows the mapping), e.g. for
    a LambdaLR with one function per torch group. lr,
    weight_decay and beta1 are read from the param groups at every step; the kind's options (power, beta2,
    ...) from `opt.config` at every step, so `opt.config.power = -0.25` takes effect at the next step.

    At construction a spec whose blocks share one small statistic across thousands of coordinates (a
    transformer's true group, through its residual stream) gives a UserWarning naming the block and the space;
    symo/optim/auto_spec.py states the rule.
    """

    def __init__(self, params: NamedParams | nn.Module, spec: SpecLike | None = None, lr: float | None = None,
                 config: SymoConfig | None = None, *, preset: str | None = None,
                 sizes: dict[str, int] | None = None, strict: bool | None = None, example_inputs: Any = None,
                 **overrides: Any) -> None:
        if config is not None and not isinstance(config, SymoConfig):
            raise TypeError(f"config must be a SymoConfig, got {type(config).__name__}")
        self.preset = None if preset is None else get_preset(preset)
        if self.preset is not None and config is not None:
            raise ValueError(f"pass preset={preset!r} or config=, not both; override a preset's values by "
                             "keyword, e.g. Symo(params, spec, preset='published', beta2=0.999)")
        if lr is None:
            lr = documented_lr(self.preset, "natural")
        # what describe() compares against: the preset, or the documented defaults
        self.base_config = SymoConfig(**self.preset.values) if self.preset is not None else SymoConfig()
        self.config = cfg = (config or self.base_config).replace(**overrides)
        if sizes is not None and not isinstance(sizes, dict):
            raise TypeError(f"sizes must be a dict {{space: int}}, got {type(sizes).__name__}")
        module = params if isinstance(params, nn.Module) else None
        if module is not None and isinstance(getattr(module, "_orig_mod", None), nn.Module):
            module = module._orig_mod  # torch.compile's wrapper: the same parameters, named as the model names them
        if spec is None and module is None:
            raise TypeError("spec is missing: pass one (a bundled name such as 'gpt_muon', a path, a Spec or a "
                            "CompiledSpec), or pass the nn.Module itself, symo.Symo(model, ...), to use the "
                            "Muon-style spec inferred from it")
        if example_inputs is not None and (spec is not None or module is None):
            raise TypeError("example_inputs= is for inferring the spec of a module passed without one, "
                            "symo.Symo(model, example_inputs=...); drop it when you pass a spec")
        if spec is not None and not isinstance(spec, (str, Path, Spec, CompiledSpec)):
            raise TypeError(f"spec must be a path, a bundled spec name, a Spec or a CompiledSpec, got "
                            f"{type(spec).__name__}")
        if module is not None:
            params = list(module.named_parameters())
        user_groups = normalise_groups(params)
        # the AdamW side's rate when none is given: ADAMW_LR at the documented rate, in proportion to lr elsewhere
        self.adamw_per_lr = adamw_per_lr = ADAMW_LR / documented_lr(self.preset, cfg.update_scale)

        def group_options(g: dict[str, Any]) -> dict[str, Any]:
            opts = {k: g.get(k, lr if k == "lr" else getattr(cfg, k)) for k in GROUP_KEYS}
            if opts["adamw_lr"] is None and _is_number(opts["lr"]):
                opts["adamw_lr"] = float(opts["lr"]) * adamw_per_lr
            if "weight_decay" in g and "adamw_wd" not in g:  # a group's decay is for all of its parameters
                opts["adamw_wd"] = opts["weight_decay"]
            return opts

        for gi, g in enumerate(user_groups):  # before compiling: a bad option fails fast
            check_group_options(group_options(g), "" if len(user_groups) == 1 else f"param group {gi}: ")
        named = {n: p for g in user_groups for n, p in g["params"]}
        shapes = {n: tuple(p.shape) for n, p in named.items()}
        device = next(iter(named.values())).device
        self.stats_dtype = resolve_stats_dtype(cfg.preconditioner.option("stats_dtype", "auto"), device)
        inferred = spec is None
        if spec is None:
            spec = auto_spec.training_spec(module, example_inputs)
        self.compiled = compile_subset(spec, shapes, sizes, strict)
        # None when the caller chose the spec; else the line describe() shows for the spec chosen here
        self.spec_reason: str | None = auto_spec.reason(self.compiled) if inferred else None
        covered = set(self.compiled.param_names)
        missing = sorted(covered - set(named))
        if missing:
            raise ValueError(f"the spec covers parameters that were not given to the optimizer: {missing}")
        specs = [self.compiled]
        partner = cfg.preconditioner.option("geometric_mean_with")
        if partner is not None:
            specs.append(compile_subset(partner, shapes, sizes, strict))
            if set(specs[1].param_names) != covered:
                raise ValueError("geometric_mean_with: both specs must cover the same parameters; "
                                 f"they differ on {sorted(covered ^ set(specs[1].param_names))}")
        self.kind: Kind = KINDS[cfg.kind][1](cfg)
        self.kind.refuse_unsupported(len(specs))
        for comp in specs:
            for text in (auto_spec.shared_statistic_warning(comp, cfg.kind),
                         auto_spec.repeated_space_scale_warning(comp, cfg.update_scale)):
                if text is not None:
                    warnings.warn(text, UserWarning, stacklevel=2)
        self.plan: list[Stage] = build_stages(
            specs, lambda b, k: self.kind.backend_for(b, k, device, self.stats_dtype))
        # the parameters whose update Muon's scale rescales to its per-shape RMS (not their own rows x cols block)
        self.rms_targets: dict[str, float] = parameter_rms.rms_targets(specs[0])

        groups = []
        for gi, g in enumerate(user_groups):
            opts = group_options(g)
            cov = [(n, p) for n, p in g["params"] if n in covered]
            unc = [(n, p) for n, p in g["params"] if n not in covered]
            if cov:
                groups.append({"params": cov, "kind": "symo", "user_group": gi, "lr": opts["lr"],
                               "beta1": opts["beta1"], "nesterov": opts["nesterov"],
                               "weight_decay": opts["weight_decay"]})
            if unc:
                groups.append({"params": unc, "kind": "adamw", "user_group": gi, "lr": opts["adamw_lr"],
                               "betas": tuple(opts["adamw_betas"]), "eps": opts["adamw_eps"],
                               "weight_decay": opts["adamw_wd"]})
        super().__init__(groups, {"lr": lr})
        shared_beta1([g["beta1"] for g in self.param_groups if g["kind"] == "symo"] or [0.0], self.kind)
        self._ready = True
        self.assignment: dict[str, str] = {
            n: ("symo" if n in covered else "adamw") for g in self.param_groups for n in g["param_names"]}
        self._compiled_step: Callable | None = None
        self.distributor: Distributor | None  # None in one process
        self.distributor, self.anchors = distribute(cfg.distributed, self.kind, self.plan, named)
        if cfg.neuron_norm_beta2 is not None:
            for stage in self.plan:  # every spec's group must leave the rows' statistic equivariant
                neuron_norm.check_rows(stage.compiled, self.kind.name)
            sharded = sorted(n for n in covered if isinstance(named[n], DTensor))
            if self.distributor is None and sharded:  # the implicit path's updates are DTensors, not rows
                raise ValueError(f"neuron_norm_beta2 with DTensor parameters ({sharded[0]!r}) needs "
                                 "distributed_mode='fsdp' (or 'auto'), not 'off'")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Only at construction: the spec is compiled for the parameters given then."""
        if getattr(self, "_ready", False):
            raise NotImplementedError("Symo compiles its spec for the parameters given at construction; "
                                      "create a new optimizer to add parameters")
        super().add_param_group(param_group)

    def describe(self) -> str:
        """Which parameters Symo preconditions (with their blocks) and which go to AdamW; for a spec the
        optimizer chose itself (`Symo(model)`), which one and why, on the second line."""
        text = report.describe(self)
        if self.spec_reason is None:
            return text
        first, _, rest = text.partition("\n")
        return "\n".join([first, fit_lines(["  " + self.spec_reason]), rest])

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
        # the covered parameters first: their step can raise (the optimizer's own numerics), and a step that
        # raises changes nothing (the AdamW parameters have not moved yet, and _step_covered commits last)
        self._step_covered([g for g in self.param_groups if g["kind"] == "symo"])
        for group in self.param_groups:
            if group["kind"] == "adamw":  # elementwise: each rank steps its own shards
                adamw_step(group, self.state, *(() if d is None else (d.local,)))
        return loss

    def _step_covered(self, groups: list[dict]) -> None:
        """Gradients -> momentum -> (owners) -> the kind's passes over the blocks -> (back) -> parameter update.

        Nothing is written until every direction is computed: the new momentum is kept aside, and the block
        states a kind changes are journaled and put back if the step raises."""
        names, params, grads, bufs, betas, nesterovs = [], [], [], [], [], []
        local = (lambda t: t) if self.distributor is None else self.distributor.local  # a shard's own part
        fresh = True  # no covered parameter has stepped before (a kind that skips its first step skips this one)
        for group in groups:
            for n, p in zip(group["param_names"], group["params"]):
                if p.grad is None:
                    continue
                st = self.state[p]
                fresh = fresh and "momentum_buffer" not in st
                buf = st.get("momentum_buffer")
                if buf is not None and buf.dtype != moment_dtype(p.dtype):  # the model changed dtype since
                    buf = st["momentum_buffer"] = buf.to(moment_dtype(p.dtype))
                if buf is None:  # kept aside until the step commits, so a step that raises leaves it fresh
                    buf = torch.zeros_like(p, dtype=moment_dtype(p.dtype))
                    if self.distributor is not None:  # a shard written in place at the commit
                        st["momentum_buffer"] = buf
                names.append(n)
                params.append(p)
                grads.append(local(p.grad))
                bufs.append(local(buf))
                betas.append(group["beta1"])
                nesterovs.append(group["nesterov"])
        if not names:
            return
        ctx = StepContext(self.stats_dtype, shared_beta1(betas, self.kind), len(self.plan), params[0].device,
                          statistics_only=fresh and self.kind.skips_first_step)
        targets = self.rms_targets if self.kind.update_scale == "muon" and self.config.parameter_rms else {}
        d = self.distributor
        if d is None and self.kind.name == "polar" and self.config.compile:
            if self._compiled_step is None:
                self._compiled_step = torch.compile(polar_step, fullgraph=True)
            updates, new_bufs = self._compiled_step(self.plan, self.kind, ctx, names, grads, bufs, tuple(betas),
                                                    tuple(nesterovs), targets)
            if self.config.check_finite:
                check_finite_updates(updates, self.kind.name)
        else:
            us_list, new_bufs = momentum(grads, bufs, betas, nesterovs)
            us = dict(zip(names, us_list))
            vectors = {"u": us}
            if "g" in self.kind.vectors():
                vectors["g"] = {n: g.to(us[n].dtype) for n, g in zip(names, grads)}
            weights = None
            if self.kind.needs_weights:
                weights = {n: local(p).detach().to(us[n].dtype) for n, p in zip(names, params)}
            owned = None
            if d is not None:
                vectors = {key: d.to_owners(names, v) for key, v in vectors.items()}
                owned = d.owned
            journal: list[tuple[dict, dict]] = []

            def journaled(k: int, stage: Stage, bid: str) -> dict[str, Any]:
                st = self._block_state(k, stage, bid)
                journal.append((st, dict(st)))  # kinds replace their state's tensors, never write into them
                return st

            try:
                updates = (directions(self.plan, self.kind, ctx, vectors, weights, set(names), journaled, owned,
                                      targets) if vectors["u"] else {})
                if d is None and self.config.check_finite:  # (sharded: each rank's own, it could stop one alone)
                    check_finite_updates(updates, self.kind.name)
            except BaseException:
                for st, before in reversed(journal):
                    st.clear()
                    st.update(before)
                raise
            if d is not None:
                updates = d.from_owners(names, updates, us)
        if ctx.statistics_only:  # the statistics are kept; the momentum and the parameters start at the next step
            for p, buf in zip(params, bufs):
                self.state[p].setdefault("momentum_buffer", buf)  # zero: marks the first step as taken
            return
        if self.config.neuron_norm_beta2 is not None:  # NorMuon's rows, once every direction is computed
            sharded = frozenset() if d is None else frozenset(n for n in names if d.rows[n] is not None)
            updates = neuron_norm.normalize(updates, {n: self.state[p] for n, p in zip(names, params)},
                                            self.config.neuron_norm_beta2, dict(zip(names, params)),
                                            None if d is None else d.all_sum, sharded)
        for p, buf, new in zip(params, bufs, new_bufs):
            if self.distributor is None:  # the new tensor becomes the buffer (no copy)
                self.state[p]["momentum_buffer"] = new
            else:  # a DTensor's local shard: written in place
                buf.copy_(new)
        lookup = {id(p): g for g in groups for p in g["params"]}
        for n, p in zip(names, params):
            group = lookup[id(p)]
            target = local(p)
            if group["weight_decay"] != 0:
                target.mul_(1 - group["lr"] * group["weight_decay"])
            target.add_(updates[n].to(p.dtype), alpha=-group["lr"])

    def _block_state(self, k: int, stage: Stage, bid: str) -> dict[str, Any]:
        return state.block_state(self, k, stage, bid)

    # ------------------------------------------------------------------ state (symo.optim.state)
    def __deepcopy__(self, memo: dict[int, Any]) -> Symo:
        return state.deep_copy(self, memo)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(state.PICKLE_REFUSAL)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus "symo": the spec key, sizes, stages and kind it was saved for, so
        `load_state_dict` can refuse a checkpoint of another spec, width, parameter set or kind."""
        return {**super().state_dict(), "symo": state.checkpoint_meta(self.plan, self.kind.name)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, plus the block states (plain tensors keyed by block id): copied to the
        parameters' device so the loaded optimizer owns them. The checkpoint is checked first
        against this optimizer's spec, widths, parameters and kind (ValueError naming what differs)."""
        check_state_dict(state_dict, self.plan, self.param_groups, self.kind)
        super().load_state_dict(state_dict)
        state.own_loaded_state(self, state_dict)

    def full_state_dict(self) -> dict[str, Any]:
        """The state consolidated, on every rank: sharded state gathered into whole tensors and every
        owner's block states under the stages' keys (collective: every rank calls it). What a rank-0
        `torch.save` checkpoint needs; `load_state_dict` takes it on any number of ranks."""
        return {**state.consolidated_state_dict(self), "symo": state.checkpoint_meta(self.plan, self.kind.name)}

    def block_statistics(self, key: str = "symo_blocks") -> dict[str, dict[str, Any]]:
        """{block id: the block's state ("step", "ema", "precond", ...: see the kind)} ("symo_gm_blocks": a
        geometric mean's second spec); with several processes, the blocks this rank owns."""
        return state.block_statistics(self, key)

    def state_bytes(self) -> int:
        """Bytes held in optimizer state tensors (momentum, AdamW moments, block states)."""
        return state.state_bytes(self.state)
