"""AdamW, the library's one implementation: the fallback for the parameters a spec does not cover, and
the auxiliary optimizer of the Muon baseline. Per parameter, the same operations in the same order as
torch.optim.AdamW's single-tensor path; moments in float32 at least (bfloat16 parameters)."""

from __future__ import annotations

from typing import Any

import torch


def moment_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics and momentum in float32 at least (bfloat16 / float16 parameters)."""
    return torch.promote_types(dtype, torch.float32)


def adamw_step(group: dict[str, Any], state: dict[torch.Tensor, dict[str, Any]]) -> None:
    """One AdamW step on the parameters of `group` ("lr", "betas", "eps", "weight_decay"); the
    moments live in `state[p]` ("step", "exp_avg", "exp_avg_sq", as torch.optim.AdamW keeps them)."""
    beta1, beta2 = group["betas"]
    for p in group["params"]:
        if p.grad is None:
            continue
        st = state[p]
        if "step" not in st:
            dt = moment_dtype(p.dtype)
            st["step"] = torch.zeros((), dtype=torch.float32)
            st["exp_avg"] = torch.zeros_like(p, dtype=dt)
            st["exp_avg_sq"] = torch.zeros_like(p, dtype=dt)
        st["step"] += 1
        t = float(st["step"])
        if group["weight_decay"] != 0:
            p.mul_(1 - group["lr"] * group["weight_decay"])
        g = p.grad.to(st["exp_avg"].dtype)
        st["exp_avg"].lerp_(g, 1 - beta1)
        st["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = group["lr"] / (1 - beta1 ** t)
        denom = (st["exp_avg_sq"].sqrt() / (1 - beta2 ** t) ** 0.5).add_(group["eps"])
        if p.dtype == denom.dtype:
            p.addcdiv_(st["exp_avg"], denom, value=-step_size)
        else:
            p.add_((st["exp_avg"] / denom).to(p.dtype), alpha=-step_size)
