"""The trivial baseline H_hat = I (the plain-gradient reference for `symo.hessian.compare`)."""

from __future__ import annotations

import math

import torch

from .common import Tensors, _shapes


class Identity:
    """H_hat = I on the given parameters ({name: tensor or shape}, or a module)."""

    def __init__(self, params) -> None:
        self.shapes = _shapes(params)
        self.param_names = list(self.shapes)

    def update(self, grads: Tensors) -> None:
        """Nothing to accumulate (kept so every estimator takes the same stream)."""

    def matvec(self, v: Tensors) -> dict[str, torch.Tensor]:
        return {n: v[n] for n in self.param_names}

    def power(self, p: float, damping: float = 0.0) -> Identity:
        return self

    def dense(self) -> torch.Tensor:
        return torch.eye(sum(math.prod(s) for s in self.shapes.values()), dtype=torch.float64)

    def factor_entries(self) -> int:
        return 0


__all__ = ["Identity"]
