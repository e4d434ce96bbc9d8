"""What a Symo optimizer tells its user: `describe()` (which parameters are preconditioned, by which
blocks and backends, at which effective rate, and how the options differ from the preset or defaults) and
`memory_report()` (state numbers against AdamW and Shampoo)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..runtime.compiled import BlockInfo, fit_lines, summarize_names
from .config import SymoConfig
from .matrix_functions import ns_method
from .plan import BlockPlan

if TYPE_CHECKING:
    from .optimizer import Symo


def describe(opt: Symo) -> str:
    cfg = opt.config
    stages = opt.plan
    sym = [n for n, k in opt.assignment.items() if k == "symo"]
    adam = [n for n, k in opt.assignment.items() if k == "adamw"]
    lines = [f"Symo: {len(sym)} parameters preconditioned by spec {opt.compiled.name!r}"
             + (f" # {stages[1].compiled.name!r}" if len(stages) > 1 else "")
             + f", {len(adam)} to AdamW",
             f"  beta1={cfg.beta1} nesterov={cfg.nesterov} beta2={cfg.beta2} source={cfg.source} "
             f"estimator={cfg.estimator} power={cfg.power} damping={cfg.damping} ({cfg.damping_mode}) "
             f"update_scale={cfg.update_scale} frequency={cfg.precondition_frequency}"
             + ("" if cfg.muon_path else f" statistics={str(opt.stats_dtype).removeprefix('torch.')}"),
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
            backend = c.backend
            if backend == "newton_schulz" and cfg.muon_path:
                backend += f" ({ns_method((b.mult, b.width), device, cfg)})"
            unit = unit_rms(b, c, cfg, len(stages))
            lines.append(f"  {tag}{b.id} {b.name}: Y {b.batch}x{b.mult}x{b.width}, d={b.dim}"
                         + ("" if unit is None else f", lr_eff={lr * unit:.3g}")
                         + f", backend={backend}; {summarize_names(b.params)}")
    adamw_lrs = sorted({g["lr"] for g in opt.param_groups if g["kind"] == "adamw"})
    lines.append("  AdamW: " + (summarize_names(adam) + f" at its own rate adamw_lr="
                                f"{', '.join(f'{x:g}' for x in adamw_lrs)} (not lr)" if adam else "(none)"))
    return fit_lines(lines)


def preset_line(opt: Symo) -> str:
    """The preset (or the defaults) and every option that differs from it."""
    base, now = opt.base_config.flat(), opt.config.flat()
    word = "preset" if opt.preset is not None else "default"
    diff = [f"{name}={now[name]!r} ({word}: {base[name]!r})" for name in now if now[name] != base[name]]
    if opt.preset is not None:
        head = f"preset {opt.preset.name!r}: {opt.preset.summary}"
    else:
        head = "no preset: the SymoConfig defaults (Muon's step at the natural scale; see symo.presets)"
    return head + ("; differs in " + ", ".join(diff) if diff else "; no option differs")


def unit_rms(b: BlockInfo, c: BlockPlan, cfg: SymoConfig, n_stages: int) -> float | None:
    """RMS per entry of the block's update at lr 1 when S is this step's vector alone: S^{-1/2} Y =
    sqrt(d) polar(Y) has squared norm d * rank over mult * width entries (full rank: an upper bound).
    None where the update is not scale-free (a power other than -1/2, or a geometric mean)."""
    if cfg.update_scale == "adamw":
        return cfg.adamw_rms
    if n_stages > 1 or cfg.power != -0.5:
        return None
    return c.scale * math.sqrt(c.dim * min(b.mult, b.width) / (b.mult * b.width))


def memory_report(opt: Symo) -> dict[str, int]:
    """State numbers the optimizer keeps, analytically, against AdamW on every parameter and against
    Shampoo's two factors per matrix (what `symo compile --optimizer` prints)."""
    numel = {n: p.numel() for g in opt.param_groups for n, p in zip(g["param_names"], g["params"])}
    shapes = {n: tuple(p.shape) for g in opt.param_groups for n, p in zip(g["param_names"], g["params"])}
    covered = [n for n, k in opt.assignment.items() if k == "symo"]
    stats = 0
    if not opt.config.muon_path:  # an EMA and its matrix function per block
        stats = sum(2 * b.batch * b.mult * b.mult for st in opt.plan for b in st.compiled.blocks)
    adamw_part = sum(2 * numel[n] for n, k in opt.assignment.items() if k == "adamw")
    return {
        "symo": sum(numel[n] for n in covered) + stats + adamw_part,
        "symo_block_statistics": stats,
        "adamw": 2 * sum(numel.values()),
        "shampoo": sum(sum(d * d for d in shapes[n]) for n in covered) + adamw_part,
    }
