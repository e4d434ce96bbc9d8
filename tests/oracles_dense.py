"""Dense float64 linear algebra for the test oracles (tests/oracles.py builds the group's action matrices):
orbit averages of one vector, the flattening of named tensors into one parameter vector and back, exact powers
of a symmetric matrix, and the true Hessian and gradient of a loss over that vector.

Nothing here imports ``symo`` or ``compiler``. Flattening order: parameters in the given order, each tensor
row-major (the order tests/oracles.py's action matrices use).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

DTYPE = torch.float64


def dense_orbit_average(actions: Sequence[torch.Tensor], v: torch.Tensor) -> torch.Tensor:
    """R2(v) = mean_g A_g v v^T A_g^T as a dense P x P float64 matrix."""
    a = torch.stack(list(actions)).to(DTYPE)
    u = a @ v.to(DTYPE).reshape(-1)  # (K, P)
    return u.T @ u / len(actions)


def dense_R1(actions: Sequence[torch.Tensor], v: torch.Tensor) -> torch.Tensor:
    """R1(v) = mean_g A_g v (projection onto the invariant vectors)."""
    a = torch.stack(list(actions)).to(DTYPE)
    return (a @ v.to(DTYPE).reshape(-1)).mean(0)


def flatten(tensors: dict[str, torch.Tensor], names: Sequence[str], dtype: torch.dtype = DTYPE) -> torch.Tensor:
    """Concatenate ``tensors[name]`` row-major, in the order ``names``."""
    return torch.cat([tensors[n].detach().reshape(-1).to(dtype) for n in names])


def unflatten(vec: torch.Tensor, names: Sequence[str], shapes: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """Inverse of ``flatten``: split ``vec`` into named tensors of the given shapes."""
    sizes = [math.prod(s) for s in shapes]
    if sum(sizes) != vec.numel():
        raise ValueError(f"vector has {vec.numel()} entries, shapes need {sum(sizes)}")
    parts = torch.split(vec.reshape(-1), sizes)
    return {n: p.reshape(tuple(s)) for n, p, s in zip(names, parts, shapes)}


def dense_power(S: torch.Tensor, p: float, damping: float = 0.0) -> torch.Tensor:
    """S^p for symmetric S via float64 eigh, with pseudo-inverse semantics.

    Eigenvalues with |x| <= 1e-12 * max|eig| * P are exact zeros and map to 0 (for any p, so a
    negative power is a pseudo-inverse power). Other eigenvalues map to (x + damping * lam_max)^p,
    lam_max the largest eigenvalue: relative damping.

    Caution: the optimizer damps PER ISOTYPIC BLOCK (lam_max of each block), so with damping > 0
    this dense oracle is only comparable when the layout has a single block (one label, one
    multiplicity block). With damping = 0 it is always comparable.
    """
    s = S.to(DTYPE)
    s = (s + s.T) / 2
    evals, evecs = torch.linalg.eigh(s)
    scale = evals.abs().max() if evals.numel() else torch.tensor(0.0, dtype=DTYPE)
    tol = 1e-12 * scale * s.shape[0]
    zero = evals.abs() <= tol
    if bool((evals < -tol).any()) and float(p) != int(p):
        raise ValueError(f"fractional power {p} of a matrix with negative eigenvalues")
    shifted = evals + damping * evals.max()
    safe = torch.where(zero, torch.ones_like(shifted), shifted)
    mapped = torch.where(zero, torch.zeros_like(evals), safe**p)
    return (evecs * mapped) @ evecs.T


def dense_hessian(
    loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    params: dict[str, torch.Tensor],
    names: Sequence[str] | None = None,
) -> torch.Tensor:
    """True Hessian (P x P, float64) of ``loss_fn(dict) -> scalar`` at ``params``.

    Computed by torch.func.hessian on the flattened float64 vector, parameters in ``names`` order
    (default: dict order), each row-major. ``loss_fn`` must accept float64 tensors.
    """
    names = list(params) if names is None else list(names)
    shapes = [tuple(params[n].shape) for n in names]
    x0 = flatten(params, names)

    def f(x: torch.Tensor) -> torch.Tensor:
        return loss_fn(unflatten(x, names, shapes))

    return torch.func.hessian(f)(x0)


def dense_gradient(
    loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    params: dict[str, torch.Tensor],
    names: Sequence[str] | None = None,
) -> torch.Tensor:
    """Flattened float64 gradient of ``loss_fn`` at ``params`` (same conventions as the Hessian)."""
    names = list(params) if names is None else list(names)
    shapes = [tuple(params[n].shape) for n in names]
    x0 = flatten(params, names)
    return torch.func.grad(lambda x: loss_fn(unflatten(x, names, shapes)))(x0)
