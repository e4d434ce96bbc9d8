"""Check a curvature estimate against the true Hessian of a small model (metrics: docs/hessian.md).

    from symo import hessian
    H  = hessian.dense(loss_fn, params)            # P x P float64, params' order, each tensor row-major
    Hv = hessian.hvp(loss_fn, params, v)            # {name: tensor}, without forming H
    m  = hessian.compare(estimate, loss_fn, params, damping=1e-8, random_directions=8, seed=0)

`loss_fn(params_dict) -> scalar` must accept float64 tensors (cast the data to the parameters' dtype
inside it). An *estimate* is anything with `.matvec({name: tensor})`; `.power(p, damping)` is used for
the Newton direction when present (conjugate gradients otherwise) and `.dense()` for the Frobenius
cosine when present. Symo's `Curvature` qualifies (use `S.power(0.5)` for H_g = S_g^{1/2}, or
`taylor(...)`), and so do the baselines of `symo.hessian.baselines`, re-exported here: `Shampoo`, `KFAC`,
`Diagonal`, `Identity`. The metrics are explained in docs/hessian.md.

Room 3 of docs/architecture.md: imports only from `symo.runtime` (room 1).
  exact.py            the true Hessian: dense, hvp, gradient, flatten / unflatten, second_order_attention
  comparison.py       compare, solve_cg, DenseEstimate
  taylor_estimate.py  Symo's taylor estimate (H = S_w^{-1} # S_g per block)
  baselines/          one baseline estimator per file: Identity, Diagonal, Shampoo, KFAC
"""

from .baselines import KFAC, Diagonal, Identity, Shampoo
from .comparison import DENSE_MAX, FROBENIUS_MAX, DenseEstimate, compare, solve_cg
from .exact import dense, flatten, gradient, hvp, second_order_attention, unflatten
from .taylor_estimate import taylor

__all__ = ["DENSE_MAX", "FROBENIUS_MAX", "KFAC", "DenseEstimate", "Diagonal", "Identity", "Shampoo", "compare",
           "dense", "flatten", "gradient", "hvp", "second_order_attention", "solve_cg", "taylor",
           "unflatten"]
