"""The block plan: what Symo decides once, at construction, for every block of its compiled spec(s).

A `Stage` is one compiled spec with the power it applies (two stages for a geometric mean); each of
its blocks gets a `BlockPlan`: its dimension d, its matrix-function backend, its update scale, its
parameters and whether its Y is the transpose of one square weight. The step only reads the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..runtime.compiled import BlockInfo, CompiledSpec
from ..runtime.linalg import ns_inverse_root_min_damping
from .config import SymoConfig


@dataclass(frozen=True)
class BlockPlan:
    """One block's static constants."""

    id: str
    dim: int
    """d, the block's isotypic dimension (at least 1)."""
    backend: str
    """"eigh" or "newton_schulz" (SymoConfig.backend resolved for this block)."""
    scale: float
    """Factor of the update (the update-scale convention, SymoConfig.update_scale)."""
    params: tuple[str, ...]
    dof: int
    """mult * d: the entries of the block's update (its RMS for update_scale="adamw")."""
    where: str
    """How messages name the block."""
    transposed: bool
    """Y is G^T of one square matrix G: Newton–Schulz iterates on G, as Muon does."""


@dataclass
class Stage:
    """One compiled spec's blocks with their plans."""

    compiled: CompiledSpec
    key: str
    """Optimizer-state key of the block statistics: "symo_blocks" / "symo_gm_blocks"."""
    power: float
    blocks: dict[str, BlockPlan] = field(default_factory=dict)


def build_stages(compiled: CompiledSpec, second: CompiledSpec | None, cfg: SymoConfig, device: torch.device,
                 stats_dtype: torch.dtype) -> list[Stage]:
    """The plan for `compiled` (and a geometric-mean partner `second`, which halves the power)."""
    if second is None:
        stages = [Stage(compiled, "symo_blocks", cfg.power)]
    else:
        stages = [Stage(compiled, "symo_blocks", cfg.power / 2), Stage(second, "symo_gm_blocks", cfg.power / 2)]
    for k, stage in enumerate(stages):
        transposed = square_transposed_blocks(stage.compiled)
        for b in stage.compiled.blocks:
            stage.blocks[b.id] = plan_block(b, stage.power, cfg, device, stats_dtype, first=k == 0,
                                            transposed=b.id in transposed)
    return stages


def plan_block(b: BlockInfo, power: float, cfg: SymoConfig, device: torch.device, stats_dtype: torch.dtype,
               first: bool, transposed: bool) -> BlockPlan:
    gram = min(b.mult, b.width) if cfg.muon_path else b.mult
    backend = cfg.backend
    if backend == "auto":
        backend = auto_backend(cfg, power, gram, device, stats_dtype)
    dim = max(b.dim, 1)
    scale = 1.0
    if cfg.update_scale in ("muon", "adamw"):
        scale = dim ** power  # divide out the natural d^{-power}
        if first and cfg.update_scale == "muon":
            scale *= math.sqrt(max(1.0, b.width / b.mult))
    return BlockPlan(b.id, dim, backend, scale, tuple(b.params), b.mult * dim, f"block {b.id} ({b.name})",
                     transposed)


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


def square_transposed_blocks(comp: CompiledSpec) -> set[str]:
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


def resolve_stats_dtype(choice: str, device: torch.device) -> torch.dtype:
    """SymoConfig.stats_dtype -> the dtype of stored statistics and their matrix functions."""
    if choice == "float64" or (choice == "auto" and device.type != "mps"):
        return torch.float64
    return torch.float32


def stack_blocks(cfg: SymoConfig, device: torch.device) -> bool:
    """Whether the Muon path stacks same-shape blocks into one call (SymoConfig.batch_blocks)."""
    return device.type != "cpu" if cfg.batch_blocks == "auto" else cfg.batch_blocks

