"""Symo's "taylor" Hessian estimate H = S_w^{-1} # S_g per isotypic block, as a `Curvature` that
`symo.hessian.compare` scores against the true Hessian."""

from __future__ import annotations

from ..runtime.curvature import Curvature
from ..runtime.linalg import sym_power, taylor_mean
from .exact import Tensors


def taylor(s_g: Curvature, weights: Tensors, damping: float = 1e-6) -> Curvature:
    """H = S_w^{-1} # S_g per isotypic block (docs/theory.md), S_w = R2(w - R1(w)) from `weights`.

    This is the estimator the optimizer's `estimator="taylor"` uses: S_w is damped with
    max(damping, 1e-8) * lambda_max before it is inverted (it is often rank deficient), and blocks
    where S_w vanishes (the invariant, trivial blocks) fall back to S_g^{1/2}. The result is a
    `Curvature` with dense factors: the commutant is an algebra, so the geometric mean stays in it.
    """
    compiled = s_g.compiled
    w = {n: weights[n].detach() for n in compiled.param_names}
    s_w = compiled.orbit_average(w, centered=True, check_finite=False)
    dense_factors = {}
    for b in s_g.block_ids:
        sg = s_g.factor(b).double()
        if b in s_w.block_ids:
            dense_factors[b] = taylor_mean(sg, s_w.factor(b).double(), damping, lam_floor=1e-300)
        else:
            dense_factors[b] = sym_power(sg, 0.5)
    return Curvature(compiled, dense_factors)


__all__ = ["taylor"]
