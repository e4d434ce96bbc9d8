"""Muon as its users run it: Newton–Schulz on every hidden 2-D weight, AdamW on everything else.

Written from the published algorithm (Keller Jordan, github.com/KellerJordan/Muon, `muon.py`:
`zeropower_via_newtonschulz5`, `muon_update`, `MuonWithAuxAdam`). Per hidden matrix W with gradient G:

    m <- beta m + (1 - beta) G ;  u = G.lerp(m, beta) (Nesterov) or m
    u <- NS5(u) * sqrt(max(1, rows / cols)) ;  W <- (1 - lr wd) W - lr u

NS5: X = u / (||u||_F + 1e-7), transposed when tall, five steps of X <- a X + (b A + c A^2) X with
A = X X^T and (a, b, c) = (3.4445, -4.7750, 2.0315), which is `symo.runtime.linalg.newton_schulz` with
`MUON_COEFFS`. The published code runs NS5 in bfloat16 on GPU; here it runs in float32. Embeddings, the
(tied) output head, LayerNorm gains and biases go to AdamW.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ..optim.adamw import adamw_step
from ..runtime.linalg import MUON_COEFFS, newton_schulz


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """Muon's default split: 2-D weights that are not embeddings or the output head."""
    leaf = name.split(".")
    return param.ndim == 2 and not any(k in leaf for k in ("wte", "wpe", "lm_head", "embed", "embedding"))


class Muon(torch.optim.Optimizer):
    """Muon on hidden matrices plus AdamW on the rest (MuonWithAuxAdam), as one torch optimizer.

    Args:
        named_params: `model.named_parameters()` or a {name: param} dict; tied parameters appear once.
        lr, momentum, nesterov, ns_steps, weight_decay: Muon's options for the hidden matrices.
        adamw_lr, adamw_betas, adamw_eps, adamw_wd: the AdamW for everything else.
        use_muon: (name, param) -> bool deciding which parameters get Muon (default `is_hidden_matrix`).
    """

    def __init__(self, named_params: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor], lr: float = 0.02,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5, weight_decay: float = 0.0,
                 adamw_lr: float = 3e-4, adamw_betas: tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8,
                 adamw_wd: float = 0.0, use_muon: Callable[[str, torch.Tensor], bool] = is_hidden_matrix) -> None:
        items = list(named_params.items() if isinstance(named_params, dict) else named_params)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        hidden = [(n, p) for n, p in items if use_muon(n, p)]
        other = [(n, p) for n, p in items if not use_muon(n, p)]
        groups = []
        if hidden:
            groups.append({"params": [p for _, p in hidden], "param_names": [n for n, _ in hidden], "kind": "muon",
                           "lr": lr, "momentum": momentum, "nesterov": nesterov, "ns_steps": ns_steps,
                           "weight_decay": weight_decay})
        if other:
            groups.append({"params": [p for _, p in other], "param_names": [n for n, _ in other], "kind": "adamw",
                           "lr": adamw_lr, "betas": tuple(adamw_betas), "eps": adamw_eps, "weight_decay": adamw_wd})
        super().__init__(groups, {"lr": lr})
        self.assignment = {n: g["kind"] for g in self.param_groups for n in g["param_names"]}

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["kind"] == "muon":
                self._muon(group)
            else:
                adamw_step(group, self.state)  # the library's one AdamW (moments in float32 at least)
        return loss

    def _muon(self, group: dict) -> None:
        beta = group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - beta)
            u = p.grad.lerp(buf, beta) if group["nesterov"] else buf
            u = newton_schulz(u.reshape(len(u), -1).float(), group["ns_steps"], MUON_COEFFS)
            u = u * max(1.0, u.shape[0] / u.shape[1]) ** 0.5
            p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(u.reshape(p.shape).to(p.dtype), alpha=-group["lr"])
