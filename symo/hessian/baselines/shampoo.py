"""Two-sided Shampoo as a Hessian estimate: H ~ L^{1/4} (x) R^{1/4} with L = sum G G^T, R = sum G^T G
for every matrix (tensors of more dimensions are reshaped to (shape[0], -1)); H ~ L^{1/2} for a vector."""

from __future__ import annotations

import math

import torch

from ...runtime.linalg import sym_power
from .common import Tensors, _Accumulator, _dense_from_matvec, _shapes


class Shampoo:
    """Two-sided Shampoo curvature: H ~ L^{1/4} (x) R^{1/4} per matrix, L^{1/2} per vector."""

    def __init__(self, params, beta: float | None = None) -> None:
        self.shapes = _shapes(params)
        self.param_names = list(self.shapes)
        self.acc = _Accumulator(beta)
        self._factors: dict[str, tuple[torch.Tensor, torch.Tensor | None]] | None = None

    def update(self, grads: Tensors) -> None:
        stats = {}
        for n in self.param_names:
            g = grads[n].detach().double()
            if g.ndim == 1:
                stats[n + ":L"] = torch.outer(g, g)
            else:
                g = g.reshape(g.shape[0], -1)
                stats[n + ":L"] = g @ g.T
                stats[n + ":R"] = g.T @ g
        self.acc.add(stats)

    def factors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """{name: (left, right)} of H itself: (L^{1/4}, R^{1/4}) for matrices, (L^{1/2}, None) for vectors."""
        if self._factors is not None:
            return self._factors
        return self._powered(1.0, 0.0)._factors

    def _powered(self, p: float, damping: float) -> Shampoo:
        out = Shampoo(self.shapes, self.acc.beta)
        fs = {}
        for n, shape in self.shapes.items():
            if self._factors is None:
                left = self.acc.get(n + ":L")
                if len(shape) == 1:
                    fs[n] = (sym_power(left, 0.5 * p, damping), None)
                else:
                    fs[n] = (sym_power(left, 0.25 * p, damping), sym_power(self.acc.get(n + ":R"), 0.25 * p, damping))
            else:  # powers of an already-powered estimate: powers of its factors
                left, right = self._factors[n]
                fs[n] = (sym_power(left, p, damping), None if right is None else sym_power(right, p, damping))
        out._factors = fs
        return out

    def matvec(self, v: Tensors) -> dict[str, torch.Tensor]:
        out = {}
        for n, (left, right) in self.factors().items():
            x = v[n]
            if right is None:
                out[n] = (left.to(x.dtype) @ x.reshape(-1)).reshape(x.shape)
            else:
                m = x.reshape(self.shapes[n][0], -1)
                out[n] = (left.to(x.dtype) @ m @ right.to(x.dtype)).reshape(x.shape)
        return out

    def power(self, p: float, damping: float = 0.0) -> Shampoo:
        """H^p: the factors' powers, each damped relative to its own largest eigenvalue."""
        return self._powered(p, damping)

    def dense(self) -> torch.Tensor:
        return _dense_from_matvec(self.matvec, self.shapes)

    def factor_entries(self) -> int:
        total = 0
        for s in self.shapes.values():
            total += s[0] ** 2 + (0 if len(s) == 1 else math.prod(s[1:]) ** 2)
        return total


__all__ = ["Shampoo"]
