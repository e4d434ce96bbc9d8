"""The linear step of weight and activation matching: with every other space held, the objective is <Q, C> in
one space's element Q. `solve_linear` is its argmax over the space's group (a linear assignment for perm and
signed_perm, orthogonal Procrustes for orthogonal), `best_values` its maximum, and `solve_heads` the joint
argmax over a head owner's (signed) permutation and each paired head's elements."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from scipy.optimize import linear_sum_assignment


def solve_linear(group: str, c: torch.Tensor) -> torch.Tensor:
    """argmax over the group of <Q, C> = sum_ij Q_ij C_ij for one n x n matrix C (any float dtype, CPU);
    `Q` acts as x'_i = sum_j Q_ij x_j, the convention of `CompiledSpec.act`."""
    if group == "identity":
        return torch.eye(c.shape[0], dtype=c.dtype)
    c64 = c.double()
    if group == "orthogonal":
        u, _, vh = torch.linalg.svd(c64)
        return (u @ vh).to(c.dtype)
    if group not in ("perm", "signed_perm"):
        raise ValueError(f"weight matching does not know the group {group!r}")
    score = c64.abs() if group == "signed_perm" else c64
    rows, cols = linear_sum_assignment(score.numpy(), maximize=True)
    rows, cols = torch.as_tensor(rows), torch.as_tensor(cols)
    q = torch.zeros_like(c64)
    q[rows, cols] = 1.0 - 2.0 * (c64[rows, cols] < 0).double() if group == "signed_perm" else 1.0
    return q.to(c.dtype)


def best_values(group: str, c: torch.Tensor) -> torch.Tensor:
    """max over the group of <Q, C> for each m x m matrix C of `c` (..., m, m): the nuclear norm for orthogonal
    (the Procrustes optimum), the linear assignment's value for perm and signed_perm, the trace for identity."""
    if group == "orthogonal":
        return torch.linalg.svdvals(c).sum(-1)
    if group == "identity":
        return torch.diagonal(c, dim1=-2, dim2=-1).sum(-1)
    flat = c.reshape(-1, *c.shape[-2:])
    values = torch.stack([(solve_linear(group, m) * m).sum() for m in flat])
    return values.reshape(c.shape[:-2])


def solve_heads(owner_group: str, c0: torch.Tensor, cross: Mapping[str, tuple[str, torch.Tensor]],
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
    """argmax of sum_ab P_ab (C0[a, b] + sum_t <R_t[a], C_t[a, b]>) over the owner's (signed) permutation P and the
    per-head elements R_t: a linear assignment of head pairs (a signed_perm owner also picks each pair's sign),
    then each pair's elements. `cross`: t -> (t's group, C_t (n, n, m, m)), float64. Returns P (n, n), the R_t
    (n, m, m) and the maximum."""
    c0, cross = c0.cpu(), {t: (group, c.cpu()) for t, (group, c) in cross.items()}
    signs = (1.0, -1.0) if owner_group == "signed_perm" else (1.0,)
    scores = torch.stack([sign * c0 + sum(best_values(group, sign * c) for group, c in cross.values())
                          for sign in signs])
    score, which = scores.max(0)
    rows, cols = linear_sum_assignment(score.numpy(), maximize=True)
    sign = torch.tensor([signs[int(which[a, b])] for a, b in zip(rows, cols)], dtype=torch.float64)
    q = torch.zeros_like(c0)
    q[torch.as_tensor(rows), torch.as_tensor(cols)] = sign
    rotations = {t: torch.stack([solve_linear(group, sign[i] * c[a, b]) for i, (a, b) in enumerate(zip(rows, cols))])
                 for t, (group, c) in cross.items()}
    return q, rotations, float(score[rows, cols].sum())
