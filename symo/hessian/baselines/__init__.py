"""Baseline curvature estimators for `symo.hessian.compare` (and for preconditioning in benchmarks).

Each is fed the same gradient stream (`update(grads)`; K-FAC also needs layer inputs and output
gradients, recorded by hooks) and represents an estimate H_hat of the Hessian with `.matvec(v)`,
`.power(p, damping)` (an estimator of the same kind holding H_hat^p) and `.dense()` (P x P, in
`param_names` order). Accumulation: `beta=None` is a running sum (original Shampoo / AdaGrad), else
an EMA with bias correction.

- `Shampoo` (shampoo.py): two-sided, H ~ L^{1/4} (x) R^{1/4} with L = sum G G^T, R = sum G^T G for every
  matrix (tensors of more dimensions are reshaped to (shape[0], -1)); H ~ L^{1/2} for a vector.
- `KFAC` (kfac.py): for `nn.Linear` layers, H ~ G (x) A with A = E[a a^T] over layer inputs (augmented by
  1 for the bias) and G = E[d d^T] over per-sample gradients of the layer's outputs (the empirical
  Fisher's Kronecker factors; weight and bias form one block).
- `Diagonal` (diagonal.py): Adam's sqrt(v), v the EMA of g^2.
- `Identity` (identity.py): H_hat = I.

Damping in `power` is relative, per factor: x -> x + damping * lambda_max(factor), and exact zeros map
to zero for negative powers (docs/theory.md, the convention of `symo.Curvature`).
"""

from .diagonal import Diagonal
from .identity import Identity
from .kfac import KFAC
from .shampoo import Shampoo

__all__ = ["KFAC", "Diagonal", "Identity", "Shampoo"]
