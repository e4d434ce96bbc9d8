"""taylor: H = S_w^{-1} # S_g (the matrix geometric mean, the solution of H S_w H = S_g), with S_g the averaged
statistic and S_w = R2(w - R1(w)) of the current weights, per block; the update is H^{2 power} u. Trivial
(invariant) blocks, where S_w vanishes, use S_g^{power}. It keeps the root kind's statistics and schedule and
differs only in the factor it refreshes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...runtime.compiled import BlockInfo
from ..matrix_function_configs import Eigh, MatrixFunction
from ..matrix_functions import stored_power, taylor_power
from .base import BlockStep, StepContext, diagonal_power
from .options import AveragedOptions, DampingOptions, PowerOptions
from .root import Root


@dataclass
class TaylorConfig(AveragedOptions, DampingOptions, PowerOptions):
    """The taylor estimator H = S_w^{-1} # S_g (S_w damped by `damping`, at least 1e-8 relative); the update
    is H^{2 power} u (power -1/2 applies H^{-1})."""

    kind: ClassVar[str] = "taylor"


class Taylor(Root):
    name = "taylor"
    needs_weights = True

    def backend_for(self, block: BlockInfo, stage: int, device: torch.device, stats_dtype: torch.dtype
                    ) -> MatrixFunction:
        return Eigh()

    def refresh(self, stage: int, blocks: list[BlockStep], ctx: StepContext) -> None:
        o = self.options
        absolute = o.damping_mode == "absolute"
        for b in blocks:
            average = b.scratch["average"]
            if b.plan.mult > o.max_precond_dim:  # above the size cap: the diagonal of S_g, as root does
                b.state["precond"] = diagonal_power(average, power=o.power, damping=o.damping, absolute=absolute)
            elif b.plan.trivial:
                b.state["precond"] = stored_power(average, power=o.power, method=Eigh(), where=b.plan.where,
                                                  damping=o.damping, absolute=absolute)
            else:
                w = b.weight().to(average.dtype)
                b.state["precond"] = taylor_power(average, w @ w.transpose(-1, -2) / b.plan.dim, power=o.power,
                                                  damping=o.damping, absolute=absolute)
        self.changes.refreshed(stage)
