"""Score a curvature estimate against the true Hessian: `compare` (cosine metrics, docs/hessian.md),
`solve_cg` (the Newton direction of an estimate without `.power`), `DenseEstimate` (a P x P matrix as an
estimate).

An *estimate* is anything with `.matvec({name: tensor})`; `.power(p, damping)` is used for the Newton
direction when present (conjugate gradients otherwise) and `.dense()` for the Frobenius cosine when
present.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..runtime.linalg import sym_power
from .exact import LossFn, Tensors, _detached, dense, flatten, gradient, hvp, unflatten

# Past these sizes compare() skips what needs the dense P x P matrices (returns None for that metric).
DENSE_MAX = 6000
FROBENIUS_MAX = 4000


def _dot(a: Tensors, b: Tensors) -> torch.Tensor:
    return sum((a[n].double() * b[n].double()).sum() for n in a)


def _cos(a: Tensors, b: Tensors) -> float:
    na, nb = math.sqrt(float(_dot(a, a))), math.sqrt(float(_dot(b, b)))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(_dot(a, b)) / (na * nb)


def _true_inverse_apply(evals: torch.Tensor, evecs: torch.Tensor, g: torch.Tensor, damping: float) -> torch.Tensor:
    """H^{-1} g for a symmetric (possibly indefinite) H with the estimators' damping convention:
    each eigenvalue moves away from zero by damping * max|lambda|; |lambda| at rounding level -> 0."""
    scale = evals.abs().max().clamp_min(1e-300)
    keep = evals.abs() > scale * 8 * math.sqrt(evals.numel()) * torch.finfo(evals.dtype).eps
    shifted = torch.where(keep, evals + torch.sign(evals) * damping * scale, torch.ones_like(evals))
    inv = torch.where(keep, 1.0 / shifted, torch.zeros_like(evals))
    return evecs @ (inv * (evecs.T @ g))


def _power_iteration_max(matvec, like: Tensors, steps: int = 50) -> float:
    gen = torch.Generator().manual_seed(1234)
    v = {n: torch.randn(t.shape, generator=gen, dtype=torch.float64) for n, t in like.items()}
    lam = 0.0
    for _ in range(steps):
        norm = math.sqrt(float(_dot(v, v)))
        if norm == 0.0:
            return 0.0
        v = {n: t / norm for n, t in v.items()}
        w = matvec(v)
        lam = float(_dot(v, w))
        v = {n: t.double() for n, t in w.items()}
    return abs(lam)


def solve_cg(matvec, b: Tensors, damping: float = 0.0, iters: int = 500, tol: float = 1e-10) -> dict[str, torch.Tensor]:
    """(A + damping * lambda_max(A) I)^{-1} b for a PSD operator given by `matvec`, by conjugate gradients."""
    b = {n: t.double() for n, t in b.items()}
    shift = damping * _power_iteration_max(matvec, b) if damping > 0 else 0.0

    def op(v):
        out = matvec(v)
        return {n: out[n].double() + shift * v[n] for n in v}

    x = {n: torch.zeros_like(t) for n, t in b.items()}
    r = dict(b)
    p = dict(r)
    rs = float(_dot(r, r))
    b_norm = math.sqrt(rs)
    for _ in range(iters):
        if math.sqrt(rs) <= tol * max(b_norm, 1e-300):
            break
        ap = op(p)
        denom = float(_dot(p, ap))
        if denom <= 0.0:
            break
        alpha = rs / denom
        x = {n: x[n] + alpha * p[n] for n in x}
        r = {n: r[n] - alpha * ap[n] for n in r}
        rs_new = float(_dot(r, r))
        p = {n: r[n] + (rs_new / rs) * p[n] for n in p}
        rs = rs_new
    return x


def _estimate_names(estimate: Any) -> list[str] | None:
    if hasattr(estimate, "param_names"):
        return list(estimate.param_names)
    compiled = getattr(estimate, "compiled", None)
    return list(compiled.param_names) if compiled is not None else None


def _estimate_dense(estimate: Any, names: list[str], like: Tensors) -> torch.Tensor:
    own = _estimate_names(estimate)
    if hasattr(estimate, "dense") and own is not None and set(names) == set(own):
        full = estimate.dense().double()
        offsets, i = {}, 0
        for n in own:  # the estimate's own order -> `names` order (and drop what params leave out)
            size = math.prod(like[n].shape)
            offsets[n] = (i, size)
            i += size
        index = torch.cat([torch.arange(offsets[n][0], offsets[n][0] + offsets[n][1]) for n in names])
        return full[index][:, index]
    total = sum(like[n].numel() for n in names)
    cols = []
    for i in range(total):
        e = torch.zeros(total, dtype=torch.float64)
        e[i] = 1.0
        out = estimate.matvec(unflatten(e, {n: like[n] for n in names}))
        cols.append(flatten({n: out[n].double() for n in names}, names))
    return torch.stack(cols, dim=1)


def compare(estimate: Any, loss_fn: LossFn, params: Tensors, damping: float = 1e-8, random_directions: int = 8,
            seed: int = 0, *, dense_max: int = DENSE_MAX, frobenius_max: int = FROBENIUS_MAX,
            hessian: torch.Tensor | None = None,
            hessian_eigh: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, float | None]:
    """Cosine similarities between an estimate H_hat and the true Hessian H at `params` (metrics: docs/hessian.md).

    Returns cos_neg_grad = cos(H_hat(-g), H(-g)); cos_random = the mean of cos(H_hat v, H v) over
    `random_directions` Gaussian v (from `seed`); cos_newton = cos(H_hat^{-1} g, H^{-1} g), both
    inverses with the same relative `damping` (H_hat by `.power(-1, damping)` or conjugate gradients,
    H by eigh with every eigenvalue moved away from zero by damping * max|lambda|), None when P >
    `dense_max`; cos_frobenius = <H_hat, H>_F / (|H_hat| |H|), None when P > `frobenius_max`. Only
    the parameters in `params` count; the estimate must cover every one of them. Pass `hessian` (the
    output of `dense`) to reuse one H across estimates, and `hessian_eigh` (torch.linalg.eigh of it)
    to reuse its eigendecomposition.
    """
    if not (math.isfinite(damping) and damping >= 0):
        raise ValueError(f"damping must be a number >= 0 (relative to the largest |eigenvalue|), got {damping}")
    if random_directions < 0:
        raise ValueError(f"random_directions must be >= 0, got {random_directions}")
    p = _detached(params)
    names = list(p)
    total = sum(t.numel() for t in p.values())
    g = gradient(loss_fn, p)
    if hessian is None and total <= dense_max:
        hessian = dense(loss_fn, p)
    if hessian is not None and hessian.shape != (total, total):
        raise ValueError(f"hessian has shape {tuple(hessian.shape)}; expected ({total}, {total}) for these params")
    if hessian is not None:
        hessian = hessian.detach()  # a metric: no graph, whatever the caller's H carries

    def true_mv(v: Tensors) -> dict[str, torch.Tensor]:
        if hessian is not None:
            return unflatten(hessian @ flatten({n: v[n].double() for n in names}, names), p)
        return hvp(loss_fn, p, v)

    def est_mv(v: Tensors) -> dict[str, torch.Tensor]:
        full = dict(v)
        out = estimate.matvec(full)
        missing = [n for n in names if n not in out]
        if missing:
            raise ValueError(f"the estimate does not cover parameters {missing}; compare only what it covers "
                             "(pass a params dict restricted to its parameters)")
        return {n: out[n].detach().double() for n in names}  # an estimate built from live parameters: no graph

    neg_g = {n: -t for n, t in g.items()}
    result: dict[str, float | None] = {"cos_neg_grad": _cos(est_mv(neg_g), true_mv(neg_g))}
    gen = torch.Generator().manual_seed(seed)
    cosines = []
    for _ in range(random_directions):
        v = {n: torch.randn(t.shape, generator=gen, dtype=torch.float64) for n, t in p.items()}
        cosines.append(_cos(est_mv(v), true_mv(v)))
    result["cos_random"] = sum(cosines) / len(cosines) if cosines else None

    if hessian is not None:
        if hasattr(estimate, "power"):
            inv = estimate.power(-1.0, damping)
            x_hat = {n: t.detach().double() for n, t in inv.matvec(dict(g)).items() if n in p}
        else:
            x_hat = solve_cg(est_mv, g, damping)
        evals, evecs = hessian_eigh if hessian_eigh is not None else torch.linalg.eigh(hessian)
        x_true = unflatten(_true_inverse_apply(evals, evecs, flatten(g, names), damping), p)
        result["cos_newton"] = _cos(x_hat, x_true)
    else:
        result["cos_newton"] = None

    if hessian is not None and total <= frobenius_max:
        h_hat = _estimate_dense(estimate, names, p).detach()
        h_hat = (h_hat + h_hat.T) / 2
        denom = float(h_hat.norm() * hessian.norm())
        result["cos_frobenius"] = float((h_hat * hessian).sum()) / denom if denom > 0 else 0.0
    else:
        result["cos_frobenius"] = None
    return result


class DenseEstimate:
    """A P x P matrix (in `names`' order) as an estimate: for tests and for comparing H with itself."""

    def __init__(self, matrix: torch.Tensor, like: Tensors) -> None:
        self.matrix = matrix.double()
        self.like = {n: t.detach() for n, t in like.items()}
        self.names = list(self.like)

    def matvec(self, v: Tensors) -> dict[str, torch.Tensor]:
        return unflatten(self.matrix @ flatten({n: v[n].double() for n in self.names}, self.names), self.like)

    def power(self, p: float, damping: float = 0.0) -> DenseEstimate:
        """Symmetric power with the convention of `compare`'s truth (sign-preserving relative damping)."""
        evals, evecs = torch.linalg.eigh((self.matrix + self.matrix.T) / 2)
        if p == -1.0:
            eye = torch.eye(len(evals), dtype=evals.dtype)
            cols = torch.stack([_true_inverse_apply(evals, evecs, e, damping) for e in eye], dim=1)
            return DenseEstimate(cols, self.like)
        return DenseEstimate(sym_power(self.matrix, p, damping), self.like)

    def dense(self) -> torch.Tensor:
        return self.matrix


__all__ = ["DENSE_MAX", "FROBENIUS_MAX", "DenseEstimate", "compare", "solve_cg"]
