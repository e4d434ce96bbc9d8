"""The optimizer zoo of "The Loss Does Not See the Basis, but Adam Does", written from the published rules.

Every rule is a `torch.optim.Optimizer` (so `symo.check_equivariance` and any torch training loop take
it), acting per parameter tensor ("per factor") unless it says otherwise. The constants and formulas
are those of the paper's published protocol (§1-2): beta1 = 0.9, beta2 = 0.999, eps = 1e-8, step counter from 1.

    opt = symo.experiments.zoo.make("muon", [("U", U), ("V", V)], lr=0.03)
    symo.experiments.zoo.RULES              # name -> (class, default lr, schedule "const" | "cos")

Learning-rate schedules are the caller's business (set `group["lr"]`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from ..runtime.linalg import newton_schulz


def ns5(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Muon's quintic Newton–Schulz polar approximation, the library's one (`symo.runtime.linalg.newton_schulz`):
    X = G / (||G||_F + 1e-7); transpose if tall; `steps` iterations of A = X X^T, B = b A + c A^2,
    X <- a X + B X with (a, b, c) = (3.4445, -4.7750, 2.0315); transpose back; no shape scale."""
    return newton_schulz(g, steps)


def _plain(params: Iterable[Any]) -> list[Any]:
    """Accept tensors, (name, tensor) pairs, or param-group dicts of either."""
    out = []
    for item in params:
        if isinstance(item, dict):
            out.append({**item, "params": [p[1] if isinstance(p, tuple) else p for p in item["params"]]})
        else:
            out.append(item[1] if isinstance(item, tuple) else item)
    return out


class _Rule(torch.optim.Optimizer):
    """Per-tensor rule: subclasses define `update(p, g, state, group) -> direction` (w <- w - lr * dir)."""

    def __init__(self, params: Iterable[Any], lr: float, **defaults: Any) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        super().__init__(_plain(params), {"lr": lr, **defaults})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._prepare()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                st["t"] = st.get("t", 0) + 1
                p.add_(self.update(p, p.grad, st, group), alpha=-group["lr"])
        return loss

    def _prepare(self) -> None:
        """Hook for rules that pool statistics over all parameters before the per-tensor updates."""

    def update(self, p, g, st, group) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class GD(_Rule):
    """w <- w - lr G."""

    def update(self, p, g, st, group):
        return g


class Adam(_Rule):
    """Bias-corrected m, v; direction m_hat / (sqrt(v_hat) + eps)."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr, betas=betas, eps=eps)

    def update(self, p, g, st, group):
        b1, b2 = group["betas"]
        m, v = _moments(st, g, b1, b2)
        t = st["t"]
        return (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + group["eps"])


def _moments(st, g, b1, b2):
    if "m" not in st:
        st["m"], st["v"] = torch.zeros_like(g), torch.zeros_like(g)
    st["m"].mul_(b1).add_(g, alpha=1 - b1)
    st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
    return st["m"], st["v"]


class AdamP(_Rule):
    """The anisotropy dial (protocol §2): D_i = (s_i + eps)^p (s_bar + eps)^(1 - p), direction
    m_hat_i / (D_i + eps), s_i = sqrt(v_hat_i), s_bar = sqrt(mean of v_hat over every entry of every
    parameter of this optimizer). p = 1 is Adam, p = 0 shared-scalar Adam (both up to one extra eps)."""

    def __init__(self, params, lr: float, p: float = 1.0, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr, p=p, betas=betas, eps=eps)

    def _prepare(self) -> None:
        # all moments first, then the pooled scale, then the updates (one s_bar per step)
        total, count = 0.0, 0
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                _moments(st, p.grad, b1, b2)
                t = st.get("t", 0) + 1
                st["v_hat"] = st["v"] / (1 - b2 ** t)
                total = total + st["v_hat"].sum()
                count += p.numel()
        self._s_bar = torch.sqrt(torch.as_tensor(total) / max(count, 1))

    def update(self, p, g, st, group):
        b1, eps, power = group["betas"][0], group["eps"], group["p"]
        m_hat = st["m"] / (1 - b1 ** st["t"])
        s = st.pop("v_hat").sqrt()
        return m_hat / (self._denominator(s, eps, power) + eps)

    def _denominator(self, s, eps, power):
        return (s + eps).pow(power) * (self._s_bar + eps) ** (1 - power)


class ScalarAdam(AdamP):
    """Shared-scalar Adam: m, v per entry as Adam; one s = sqrt(mean v_hat over all entries of all
    parameters) + eps; direction m_hat / s. Gauge-equivariant (s is a function of ||G||'s history)."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr, p=0.0, betas=betas, eps=eps)

    def update(self, p, g, st, group):
        st.pop("v_hat")
        return (st["m"] / (1 - group["betas"][0] ** st["t"])) / (self._s_bar + group["eps"])


class RMSProp(_Rule):
    """v <- alpha v + (1 - alpha) G^2 (no correction, no momentum); direction G / (sqrt(v) + eps)."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-8) -> None:
        super().__init__(params, lr, alpha=alpha, eps=eps)

    def update(self, p, g, st, group):
        v = st.setdefault("v", torch.zeros_like(g))
        v.mul_(group["alpha"]).addcmul_(g, g, value=1 - group["alpha"])
        return g / (v.sqrt() + group["eps"])


class Signum(_Rule):
    """m <- beta m + (1 - beta) G; direction sign(m). (signSGD with momentum.)"""

    def __init__(self, params, lr: float, beta: float = 0.9) -> None:
        super().__init__(params, lr, beta=beta)

    def update(self, p, g, st, group):
        m = st.setdefault("m", torch.zeros_like(g))
        m.mul_(group["beta"]).add_(g, alpha=1 - group["beta"])
        return torch.sign(m)


class Lion(_Rule):
    """c = sign(beta1 m + (1 - beta1) G); m <- beta2 m + (1 - beta2) G; direction c."""

    def __init__(self, params, lr: float, betas=(0.9, 0.99)) -> None:
        super().__init__(params, lr, betas=betas)

    def update(self, p, g, st, group):
        b1, b2 = group["betas"]
        m = st.setdefault("m", torch.zeros_like(g))
        c = torch.sign(b1 * m + (1 - b1) * g)
        m.mul_(b2).add_(g, alpha=1 - b2)
        return c


class Adafactor(_Rule):
    """Factored second moment, no momentum: r, c = EMAs (beta2) of the row and column means of G^2,
    not bias-corrected (the protocol corrects only Adam's moments, and with uncorrected r, c the zoo's
    Adafactor cell at rate 3e-4 gives the published recovery, 0.543); v_hat = r c^T / mean(r) + 1e-30;
    direction G / (sqrt(v_hat) + eps). 1-D tensors: an unfactored v, also uncorrected."""

    def __init__(self, params, lr: float, beta2: float = 0.999, eps: float = 1e-8) -> None:
        super().__init__(params, lr, beta2=beta2, eps=eps)

    def update(self, p, g, st, group):
        b2 = group["beta2"]
        g2 = g * g
        if g.dim() != 2:
            v = st.setdefault("v", torch.zeros_like(g))
            v.mul_(b2).add_(g2, alpha=1 - b2)
            return g / (v.sqrt() + group["eps"])
        r = st.setdefault("r", torch.zeros(g.shape[0], dtype=g.dtype, device=g.device))
        c = st.setdefault("c", torch.zeros(g.shape[1], dtype=g.dtype, device=g.device))
        r.mul_(b2).add_(g2.mean(dim=1), alpha=1 - b2)
        c.mul_(b2).add_(g2.mean(dim=0), alpha=1 - b2)
        v_hat = torch.outer(r, c) / r.mean() + 1e-30
        return g / (v_hat.sqrt() + group["eps"])


class Muon(_Rule):
    """m <- momentum m + G (no Nesterov); direction NS5(m). Matrices only."""

    def __init__(self, params, lr: float, momentum: float = 0.9, ns_steps: int = 5) -> None:
        super().__init__(params, lr, momentum=momentum, ns_steps=ns_steps)
        _require_matrices(self, "Muon")

    def update(self, p, g, st, group):
        m = st.setdefault("m", torch.zeros_like(g))
        m.mul_(group["momentum"]).add_(g)
        return ns5(m, group["ns_steps"])


class Shampoo(_Rule):
    """L += G G^T, R += G^T G (sums); every `update_freq` steps ((t-1) % f == 0) L_inv = (L + eps I)^(-1/4),
    R_inv = (R + eps I)^(-1/4) by eigh (symmetrised, eigenvalues clamped at 0 before eps is added, eps > 0);
    direction L_inv G R_inv."""

    def __init__(self, params, lr: float, update_freq: int = 20, eps: float = 1.0) -> None:
        if not eps > 0:  # the root is (L + eps I)^(-1/4): without damping it would not exist for a singular L
            raise ValueError(f"eps must be > 0, got {eps}")
        super().__init__(params, lr, update_freq=update_freq, eps=eps)
        _require_matrices(self, "Shampoo")

    def update(self, p, g, st, group):
        if "L" not in st:
            st["L"] = torch.zeros(g.shape[0], g.shape[0], dtype=g.dtype, device=g.device)
            st["R"] = torch.zeros(g.shape[1], g.shape[1], dtype=g.dtype, device=g.device)
        st["L"].add_(g @ g.T)
        st["R"].add_(g.T @ g)
        if (st["t"] - 1) % group["update_freq"] == 0:
            st["L_inv"] = _inv_root4(st["L"], group["eps"])
            st["R_inv"] = _inv_root4(st["R"], group["eps"])
        return st["L_inv"] @ g @ st["R_inv"]


def _inv_root4(a: torch.Tensor, eps: float) -> torch.Tensor:
    """(A + eps I)^(-1/4) of the symmetrised A by float64 eigh, eigenvalues clamped at 0 first, as the
    protocol's Shampoo computes it: every eigenvalue, a zero one included, is damped by eps (the library's
    `sym_power` maps zeros to zero instead, Symo's convention)."""
    sym = ((a + a.transpose(-1, -2)) / 2).to(torch.float64)
    evals, evecs = torch.linalg.eigh(sym)
    f = (evals.clamp_min(0) + eps).pow(-0.25)
    return ((evecs * f.unsqueeze(-2)) @ evecs.transpose(-1, -2)).to(a.dtype)


def _require_matrices(opt: torch.optim.Optimizer, name: str) -> None:
    for group in opt.param_groups:
        for p in group["params"]:
            if p.dim() != 2:
                raise ValueError(f"{name} takes matrices only; got a parameter of shape {tuple(p.shape)} "
                                 "(give 1-D parameters to another optimizer)")


# name -> (class, a default learning rate for a quick check, schedule of the matrix-sensing protocol)
RULES: dict[str, tuple[type[_Rule], float, str]] = {
    "gd": (GD, 0.1, "const"),
    "adam": (Adam, 1e-2, "const"),
    "scalar_adam": (ScalarAdam, 1e-2, "const"),
    "rmsprop": (RMSProp, 1e-3, "cos"),
    "signum": (Signum, 1e-3, "cos"),
    "lion": (Lion, 1e-3, "cos"),
    "adafactor": (Adafactor, 1e-3, "const"),
    "muon": (Muon, 3e-2, "cos"),
    "shampoo": (Shampoo, 0.1, "const"),
}


def make(name: str, params: Iterable[Any], lr: float | None = None, **options: Any) -> torch.optim.Optimizer:
    """Build zoo rule `name` (a key of RULES, or "adam_p" with p=...) on `params` (tensors or named pairs)."""
    if name == "adam_p":
        return AdamP(params, lr if lr is not None else 1e-2, **options)
    if name not in RULES:
        raise ValueError(f"unknown zoo rule {name!r}; choose one of {sorted(RULES) + ['adam_p']}")
    cls, default_lr, _ = RULES[name]
    return cls(params, lr if lr is not None else default_lr, **options)


def cosine_lr(lr: float, t: int, total: int) -> float:
    """eta (1 + cos(pi t / total)) / 2, no warm-up (t counts from 1)."""
    return lr * (1 + math.cos(math.pi * t / total)) / 2


__all__ = ["GD", "RULES", "Adafactor", "Adam", "AdamP", "Lion", "Muon", "RMSProp", "ScalarAdam", "Shampoo",
           "Signum", "cosine_lr", "make", "ns5"]
