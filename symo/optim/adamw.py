"""AdamW, the library's one implementation: the fallback for the parameters a spec does not cover, and
the auxiliary optimizer of the Muon baseline. Per parameter, the same operations in the same order as
torch.optim.AdamW's single-tensor path; moments in float32 at least (bfloat16 parameters)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def moment_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics and momentum in float32 at least (bfloat16 / float16 parameters)."""
    return torch.promote_types(dtype, torch.float32)


def adamw_step(group: dict[str, Any], state: dict[torch.Tensor, dict[str, Any]],
               local: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> None:
    """One AdamW step on the parameters of `group` ("lr", "betas", "eps", "weight_decay"); the
    moments live in `state[p]` ("step", "exp_avg", "exp_avg_sq", as torch.optim.AdamW keeps them).
    `local` gives the part of a tensor this process holds (a DTensor's shard): every operation is
    elementwise, so stepping the shards is stepping the whole, without DTensor's per-operation dispatch."""
    beta1, beta2 = group["betas"]
    for p in group["params"]:
        if p.grad is None:
            continue
        st = state[p]
        dt = moment_dtype(p.dtype)
        if "step" not in st:
            st["step"] = torch.zeros((), dtype=torch.float32)
            st["exp_avg"] = torch.zeros_like(p, dtype=dt)
            st["exp_avg_sq"] = torch.zeros_like(p, dtype=dt)
        elif st["exp_avg"].dtype != dt:  # the model changed dtype since (model.double()): its moments follow
            st["exp_avg"], st["exp_avg_sq"] = st["exp_avg"].to(dt), st["exp_avg_sq"].to(dt)
        st["step"] += 1
        t = float(st["step"])
        w, exp_avg, exp_avg_sq = local(p), local(st["exp_avg"]), local(st["exp_avg_sq"])
        if group["weight_decay"] != 0:
            w.mul_(1 - group["lr"] * group["weight_decay"])
        g = local(p.grad).to(exp_avg.dtype)
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = group["lr"] / (1 - beta1 ** t)
        denom = (exp_avg_sq.sqrt() / (1 - beta2 ** t) ** 0.5).add_(group["eps"])
        if w.dtype == denom.dtype:
            w.addcdiv_(exp_avg, denom, value=-step_size)
        else:
            w.add_((exp_avg / denom).to(w.dtype), alpha=-step_size)
