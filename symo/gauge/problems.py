"""The default problem of `symo.check_equivariance`: a small float64 matrix-sensing problem W = U V^T,
whose O(k) gauge (U, V) -> (U Q, V Q) is an exact symmetry of the loss (specs/factored.toml)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch


def factored_problem(m: int = 6, n: int = 5, k: int = 4, rank: int = 2, measurements: int = 24,
                     init_scale: float = 0.3, seed: int = 0
                     ) -> tuple[dict[str, torch.Tensor], Callable[[Mapping[str, torch.Tensor]], torch.Tensor]]:
    """A small float64 matrix-sensing problem W = U V^T: params {"U": m x k, "V": n x k} and its loss
    mean((A vec(U V^T) - y)^2). Its O(k) gauge is specs/factored.toml."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(m, rank, generator=g, dtype=torch.float64) @ torch.randn(
        rank, n, generator=g, dtype=torch.float64) / math.sqrt(rank)
    a = torch.randn(measurements, m * n, generator=g, dtype=torch.float64)
    y = a @ target.reshape(-1)
    params = {"U": init_scale * torch.randn(m, k, generator=g, dtype=torch.float64),
              "V": init_scale * torch.randn(n, k, generator=g, dtype=torch.float64)}

    def loss_fn(w: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return ((a @ (w["U"] @ w["V"].T).reshape(-1) - y) ** 2).mean()

    return params, loss_fn


__all__ = ["factored_problem"]
