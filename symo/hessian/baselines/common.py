"""What the baseline estimators share: accumulation of their statistics (a running sum or a
bias-corrected EMA), parameter shapes from a module or a dict, and the dense P x P matrix of a matvec.

Damping in every estimator's `power` is relative, per factor: x -> x + damping * lambda_max(factor), and
exact zeros map to zero for negative powers (docs/theory.md, the convention of `symo.Curvature`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

Tensors = Mapping[str, torch.Tensor]


class _Accumulator:
    """Running sum (beta None) or bias-corrected EMA of per-key statistics."""

    def __init__(self, beta: float | None) -> None:
        if beta is not None and not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be None (running sum) or in [0, 1); got {beta}")
        self.beta = beta
        self.steps = 0
        self.stats: dict[str, torch.Tensor] = {}

    def add(self, stats: dict[str, torch.Tensor]) -> None:
        self.steps += 1
        for k, s in stats.items():
            s = s.detach().double()
            if k not in self.stats:
                self.stats[k] = s.clone() if self.beta is None else (1 - self.beta) * s
            elif self.beta is None:
                self.stats[k] += s
            else:
                self.stats[k].mul_(self.beta).add_(s, alpha=1 - self.beta)

    def get(self, k: str) -> torch.Tensor:
        s = self.stats[k]
        if self.beta is None or self.steps == 0:
            return s
        return s / (1 - self.beta ** self.steps)


def _shapes(params) -> dict[str, tuple[int, ...]]:
    if isinstance(params, nn.Module):
        params = dict(params.named_parameters())
    if isinstance(params, Mapping):
        items = params.items()
    else:
        items = list(params)
    return {n: tuple(t.shape) if hasattr(t, "shape") else tuple(t) for n, t in items}


def _dense_from_matvec(matvec, shapes: dict[str, tuple[int, ...]]) -> torch.Tensor:
    names = list(shapes)
    sizes = [math.prod(s) for s in shapes.values()]
    eye = torch.eye(sum(sizes), dtype=torch.float64)
    cols = eye.split(sizes, dim=1)
    basis = {n: c.reshape(-1, *shapes[n]) for n, c in zip(names, cols)}
    out = torch.func.vmap(matvec)(basis)
    return torch.cat([out[n].reshape(eye.shape[0], -1) for n in names], dim=1).T


__all__ = ["Tensors"]
