"""The stored block statistics: A = EMA of Y Y^T / d per isotypic block, bias-corrected, and the schedule
on which their matrix function is refreshed (SymoConfig.beta2, precondition_frequency, stats_dtype).

A block's state is a dict {"step": int, "ema": (batch, mult, mult), "precond": (batch, mult, mult)}
kept in the optimizer's state under the stage's key, so `state_dict()` saves it.
"""

from __future__ import annotations

from typing import Any

import torch

from .config import SymoConfig


def update_statistic(st: dict[str, Any], ys: torch.Tensor, dim: int, cfg: SymoConfig,
                     stats_dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
    """Fold this step's coordinates `ys` into the block's statistic held in `st`.

    Returns the bias-corrected average and whether its matrix function is due this step. The
    statistic, its EMA and its matrix function live in `stats_dtype` (float64 by default: the products
    of float32 coordinates are then exact and no direction is lost to rounding)."""
    ys = ys.to(stats_dtype)
    stat = ys @ ys.transpose(-1, -2) / dim
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
    st["step"] = st.get("step", 0) + 1
    due = (st["step"] - 1) % cfg.precondition_frequency == 0 or "precond" not in st
    average = ema / (1 - cfg.beta2 ** st["step"]) if 0.0 < cfg.beta2 < 1.0 else ema
    return average, due
