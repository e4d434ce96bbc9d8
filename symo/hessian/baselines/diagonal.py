"""Adam's diagonal as a Hessian estimate: H_hat = diag(sqrt(v)), v the bias-corrected EMA of g^2."""

from __future__ import annotations

import math

import torch

from .common import Tensors, _Accumulator, _shapes


class Diagonal:
    """Adam's diagonal: H_hat = diag(sqrt(v)), v = bias-corrected EMA (beta) of g^2."""

    def __init__(self, params, beta: float | None = 0.999) -> None:
        self.shapes = _shapes(params)
        self.param_names = list(self.shapes)
        self.acc = _Accumulator(beta)
        self._diag: dict[str, torch.Tensor] | None = None

    def update(self, grads: Tensors) -> None:
        self.acc.add({n: grads[n].double() ** 2 for n in self.param_names})

    def diagonal(self) -> dict[str, torch.Tensor]:
        if self._diag is not None:
            return self._diag
        return {n: self.acc.get(n).sqrt() for n in self.param_names}

    def matvec(self, v: Tensors) -> dict[str, torch.Tensor]:
        d = self.diagonal()
        return {n: d[n].to(v[n].dtype) * v[n] for n in self.param_names}

    def power(self, p: float, damping: float = 0.0) -> Diagonal:
        d = self.diagonal()
        lam = max(float(t.max()) for t in d.values())
        out = Diagonal(self.shapes, self.acc.beta)
        tol = lam * 8 * math.sqrt(sum(t.numel() for t in d.values())) * torch.finfo(torch.float64).eps
        out._diag = {n: torch.where(t > tol, (t + damping * lam).pow(p), torch.zeros_like(t)) if p < 0
                     else (t + damping * lam).pow(p) for n, t in d.items()}
        return out

    def dense(self) -> torch.Tensor:
        d = self.diagonal()
        return torch.diag(torch.cat([d[n].reshape(-1) for n in self.param_names]))

    def factor_entries(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())


__all__ = ["Diagonal"]
