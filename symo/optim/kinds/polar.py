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
from ..matrix_function_configs import Auto, CoupledNewton, Eigh, MatrixFunction, NewtonSchulz
from ..matrix_functions import current_statistic_apply
from ..plan import stack_blocks
from .base import BlockStep, Kind, StepContext, finish, update_scale_factor
from .options import DampingOptions, PolarFactorOptions, PowerOptions, StatisticOptions


@dataclass
class PolarConfig(StatisticOptions, DampingOptions, PolarFactorOptions, PowerOptions):
    """The current statistic, used at once (Muon's step). power -1/2 is the polar factor; another power goes
    through the Gram side's eigh. `backend` is the polar factor's matrix function (PolarFactorOptions: Auto(),
    Eigh(), NewtonSchulz(...), or their strings); `inverse_root` the gradient statistic's."""

    kind: ClassVar[str] = "polar"
    inverse_root: CoupledNewton = CoupledNewton()
    """statistic="gradient" on the blocks that take the iteration: the coupled Newton–Schulz iteration for S^{-1/2}
    (flat keyword: ns_inverse_steps, its steps)."""
    shortcuts: ClassVar[dict[str, tuple[str, type, str]]] = {
        **PolarFactorOptions.shortcuts, "ns_inverse_steps": ("inverse_root", CoupledNewton, "steps")}

    def __post_init__(self) -> None:
        super().__post_init__()
        raise_first([(not isinstance(self.backend, NewtonSchulz) or self.power == -0.5,
                      "the newton_schulz backend computes the -1/2 power only (power = -0.5)")])


class Polar(Kind):
    name = "polar"
    stateful = False

    def backend_for(self, block: BlockInfo, stage: int, device: torch.device, stats_dtype: torch.dtype
                    ) -> MatrixFunction:
        o = self.options
        if not isinstance(o.backend, Auto):
            return o.backend
        large = o.power == -0.5 and min(block.mult, block.width) > o.backend.eigh_max_size
        return o.backend.iteration if large else Eigh()

    def apply(self, stage: int, direction: str, blocks: list[BlockStep], ctx: StepContext
              ) -> list[dict[str, torch.Tensor]]:
        o, cfg = self.options, self.config
        absolute = o.damping_mode == "absolute"

        def one(y: torch.Tensor, s: torch.Tensor, b: BlockStep) -> torch.Tensor:
            z, extra = current_statistic_apply(y, statistic=s, plan=b.plan, power=o.power, damping=o.damping,
                                               absolute=absolute, stats_dtype=ctx.stats_dtype,
                                               inverse_root=o.inverse_root)
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
