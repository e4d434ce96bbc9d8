"""polar: Muon's step on the spec's blocks. The statistic is this step's vector alone, so
S^{-1/2} Y = sqrt(d) polar(Y): nothing is stored per block, and the polar factor comes from Newton–Schulz on Y
or from the smaller Gram side's eigh. With a Muon-style spec and Muon's update scale this is Muon, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...runtime.compiled import BlockInfo
from ..checks import raise_first
from ..matrix_functions import current_statistic_apply
from ..plan import stack_blocks
from .base import (
    BlockStep,
    DampingOptions,
    Kind,
    NewtonSchulzOptions,
    PowerOptions,
    StatisticOptions,
    StepContext,
    finish,
    update_scale_factor,
)


@dataclass
class PolarConfig(StatisticOptions, DampingOptions, NewtonSchulzOptions, PowerOptions):
    """The current statistic, used at once (Muon's step). power -1/2 is the polar factor; another power goes
    through the Gram side's eigh."""

    kind: ClassVar[str] = "polar"
    ns_inverse_steps: int = 25
    """statistic="gradient" with the newton_schulz backend: coupled Newton–Schulz steps for S^{-1/2}."""

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([(self.backend != "newton_schulz" or self.power == -0.5,
                      "the newton_schulz backend computes the -1/2 power only (power = -0.5)"),
                     (self.ns_inverse_steps >= 1, f"ns_inverse_steps must be >= 1, got {self.ns_inverse_steps}")])


class Polar(Kind):
    name = "polar"
    stateful = False

    def backend_for(self, block: BlockInfo, stage: int, device: torch.device, stats_dtype: torch.dtype) -> str:
        o = self.options
        if o.backend != "auto":
            return o.backend
        large = o.power == -0.5 and min(block.mult, block.width) > o.eigh_max_size
        return "newton_schulz" if large else "eigh"

    def apply(self, stage: int, direction: str, blocks: list[BlockStep], ctx: StepContext
              ) -> list[dict[str, torch.Tensor]]:
        o, cfg = self.options, self.config
        absolute = o.damping_mode == "absolute"

        def one(y: torch.Tensor, s: torch.Tensor, b: BlockStep) -> torch.Tensor:
            z, extra = current_statistic_apply(y, s, b.plan, nso=o, power=o.power, damping=o.damping,
                                               absolute=absolute, stats_dtype=ctx.stats_dtype)
            return finish(z, b.plan, cfg.update_scale, cfg.adamw_rms,
                          update_scale_factor(b.plan, cfg.update_scale, o.power, True) * extra)

        if not stack_blocks(cfg.batch_blocks, ctx.device):
            return [{"u": one(b.coords["u"], b.stat, b)} for b in blocks]
        # blocks are (batch, mult, width) and every matrix function acts per batch element, so stacking
        # same-shape blocks along the batch axis computes the same thing in one call
        out: list[dict[str, torch.Tensor]] = [{} for _ in blocks]
        groups: dict[tuple, list[int]] = {}
        for i, b in enumerate(blocks):
            c, y = b.plan, b.coords["u"]
            key = (tuple(y.shape[1:]), tuple(b.stat.shape[1:]), c.dim, c.backend, c.mult, c.width, c.transposed,
                   b.stat is y)
            groups.setdefault(key, []).append(i)
        for ids in groups.values():
            if len(ids) == 1:
                b = blocks[ids[0]]
                out[ids[0]]["u"] = one(b.coords["u"], b.stat, b)
                continue
            y = torch.cat([blocks[i].coords["u"] for i in ids])
            s = y if blocks[ids[0]].stat is blocks[ids[0]].coords["u"] else torch.cat([blocks[i].stat for i in ids])
            first = blocks[ids[0]]
            stacked = BlockStep(first.plan, {}, {"u": y}, s, None)
            for i, z in zip(ids, one(y, s, stacked).split([blocks[i].coords["u"].shape[0] for i in ids])):
                out[i]["u"] = z
        return out
