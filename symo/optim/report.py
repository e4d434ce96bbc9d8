"""What a Symo optimizer tells its user: `describe()` (which parameters are preconditioned, by which
blocks and backends, at which effective rate, and how the options differ from the preset or defaults) and
`memory_report()` (state numbers against AdamW and Shampoo)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..runtime.compiled import BlockInfo
from ..runtime.text import fit_lines, summarize_names
from .config import ADAMW_LR, SymoConfig
from .kinds.base import update_scale_factor
from .matrix_function_configs import NewtonSchulz
from .matrix_functions import ns_method
from .plan import BlockPlan

if TYPE_CHECKING:
    from .optimizer import Symo


def describe(opt: Symo) -> str:
    cfg = opt.config
    stages = opt.plan
    sym = [n for n, k in opt.assignment.items() if k == "symo"]
    adam = [n for n, k in opt.assignment.items() if k == "adamw"]
    values = {n: cfg.preconditioner.option(n) for n in cfg.preconditioner.option_names()
              if n not in ("ns_coeffs", "geometric_mean_with")}
    kind_options = " ".join(f"{n}={getattr(v, 'kind', v)!r}" for n, v in values.items())
    lines = [f"Symo: {len(sym)} parameters preconditioned by spec {opt.compiled.name!r}"
             + (f" # {stages[1].compiled.name!r}" if len(stages) > 1 else "")
             + f", {len(adam)} to AdamW",
             f"  preconditioner {cfg.kind!r}: {kind_options}",
             f"  beta1={_group_values(opt, 'beta1')} nesterov={_group_values(opt, 'nesterov')} "
             f"update_scale={cfg.update_scale}"
             + ("" if cfg.neuron_norm_beta2 is None else f" neuron_norm_beta2={cfg.neuron_norm_beta2} (NorMuon's rows)")
             + ("" if not opt.kind.stateful else f" statistics={str(opt.stats_dtype).removeprefix('torch.')}"),
             "  " + preset_line(opt)]
    if opt.distributor is not None:
        d = opt.distributor
        mine = [c for c in d.components if c.owner == d.rank]
        lines.append(f"  distributed ({d.mode}): rank {d.rank} of {d.world} computes {len(mine)} of "
                     f"{len(d.components)} coupling components ({sum(len(c.blocks) for c in mine)} of "
                     f"{sum(len(c.blocks) for c in d.components)} blocks); docs/distributed.md")
    lrs = sorted({g["lr"] for g in opt.param_groups if g["kind"] == "symo"})
    lines.append(f"  learning rate {', '.join(f'{lr:g}' for lr in lrs)}; per block, lr_eff = lr x the RMS "
                 "per entry of the unit update when the statistic is this step's vector alone (the "
                 "averaged statistic gives at most about that): compare lr_eff with Adam's rate")
    device = next((p.device for g in opt.param_groups if g["kind"] == "symo" for p in g["params"]),
                  torch.device("cpu"))
    lr = lrs[0] if lrs else 0.0
    for stage in stages:
        for b in stage.compiled.blocks:
            c = stage.blocks[b.id]
            tag = f"[{stage.compiled.name}] " if len(stages) > 1 else ""
            backend = c.backend.label
            if isinstance(c.backend, NewtonSchulz):
                backend += f" ({ns_method((b.mult, b.width), device, c.backend)})"
            unit = unit_rms(b, c, cfg, len(stages))
            lines.append(f"  {tag}{b.id} {b.name}: Y {b.batch}x{b.mult}x{b.width}, d={b.dim}"
                         + ("" if unit is None else f", lr_eff={lr * unit:.3g}")
                         + f", backend={backend}; {summarize_names(b.params)}")
    matched = sorted(opt.rms_targets) if cfg.update_scale == "muon" and cfg.parameter_rms else []
    if matched:
        lines.append("  at Muon's per-shape RMS (lr / sqrt(fan_in) per entry; their blocks are not their own rows x "
                     f"cols, parameter_rms=True): {summarize_names(matched)}")
    users = {g.get("user_group", 0) for g in opt.param_groups}
    if len(users) > 1 and len(opt.param_groups) > len(users):
        lines.append(f"  param groups: {len(users)} given -> {len(opt.param_groups)} torch groups (each split into "
                     "its covered 'symo' part and its 'adamw' part; a group's 'user_group' names the one it came "
                     "from): " + ", ".join(f"{g.get('user_group', 0)}:{g['kind']}" for g in opt.param_groups))
    adamw_lrs = sorted({g["lr"] for g in opt.param_groups if g["kind"] == "adamw"})
    follows = (f"adamw_lr=None: {opt.adamw_per_lr:.3g} x lr, {ADAMW_LR:g} at the documented rate "
               f"{ADAMW_LR / opt.adamw_per_lr:g}" if cfg.adamw_lr is None else "adamw_lr")
    lines.append("  AdamW: " + (summarize_names(adam) + f" at its own rate "
                                f"{', '.join(f'{x:g}' for x in adamw_lrs)} ({follows})" if adam else "(none)"))
    return fit_lines(lines)


def preset_line(opt: Symo) -> str:
    """The preset (or the defaults) and every option that differs from it."""
    now = opt.config.flat()
    base = opt.base_config
    if base.kind != opt.config.kind:  # another kind: its options compare with that kind's defaults
        base = base.replace(preconditioner=opt.config.kind)
    base = {**base.flat(), "preconditioner": opt.base_config.kind}
    word = "preset" if opt.preset is not None else "default"
    diff = [f"{name}={now[name]!r} ({word}: {base.get(name, '-')!r})" for name in now
            if name not in base or now[name] != base[name]]
    if opt.preset is not None:
        head = f"preset {opt.preset.name!r}: {opt.preset.summary}"
    else:
        head = ("no preset: the SymoConfig defaults (the polar kind: Muon's step at the natural scale, not the "
                "published method; see symo.PRESETS)")
    return head + ("; differs in " + ", ".join(diff) if diff else "; no option differs")


def unit_rms(b: BlockInfo, c: BlockPlan, cfg: SymoConfig, n_stages: int) -> float | None:
    """RMS per entry of the block's update at lr 1 when S is this step's vector alone: S^{-1/2} Y =
    sqrt(d) polar(Y) has squared norm d * rank over mult * width entries (full rank: an upper bound).
    None where the update is not scale-free (a power other than -1/2, a geometric mean, or a kind whose
    update is not a power of the statistic)."""
    if cfg.update_scale == "adamw":
        return cfg.adamw_rms
    if cfg.kind not in ("polar", "root", "then_orthogonalize") or n_stages > 1:
        return None
    power = -0.5 if cfg.kind == "then_orthogonalize" else cfg.power
    if power != -0.5:
        return None
    scale = update_scale_factor(c, cfg.update_scale, power, True)
    return scale * math.sqrt(c.dim * min(b.mult, b.width) / (b.mult * b.width))


def memory_report(opt: Symo) -> dict[str, int]:
    """State numbers the optimizer keeps, analytically, against AdamW on every parameter and against
    Shampoo's two factors per matrix (what `symo compile --optimizer` prints)."""
    numel = {n: p.numel() for g in opt.param_groups for n, p in zip(g["param_names"], g["params"])}
    shapes = {n: tuple(p.shape) for g in opt.param_groups for n, p in zip(g["param_names"], g["params"])}
    covered = [n for n, k in opt.assignment.items() if k == "symo"]
    stats = sum(math.prod(shape) for k, st in enumerate(opt.plan) for b in st.compiled.blocks
                for shape in opt.kind.state_shapes(b, k, len(opt.plan)).values() if shape is not None)
    adamw_part = sum(2 * numel[n] for n, k in opt.assignment.items() if k == "adamw")
    return {
        "symo": sum(numel[n] for n in covered) + stats + adamw_part,
        "symo_block_statistics": stats,
        "adamw": 2 * sum(numel.values()),
        "shampoo": sum(sum(d * d for d in shapes[n]) for n in covered) + adamw_part,
    }


def _group_values(opt: Symo, key: str) -> str:
    """A per-group option as the covered groups hold it now (a loaded checkpoint's or a schedule's value, not the
    constructor's): one value, or each group's."""
    values = [g[key] for g in opt.param_groups if g["kind"] == "symo"] or [getattr(opt.config, key)]
    return str(values[0]) if all(v == values[0] for v in values) else "/".join(str(v) for v in values)
