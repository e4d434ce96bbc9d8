"""`symo.laplace`: a Laplace approximation whose posterior precision is Symo's orbit-averaged curvature.

    la = symo.laplace.SymoLaplace(model, "mlp_relu", likelihood="classification")
    la.fit(train_loader)
    probs = la.predictive(x, pred_type="glm", link_approx="probit")

Room 3 of docs/architecture.md: imports only from `symo.compiler` (room 0) and `symo.runtime` (room 1).
  approximation.py  SymoLaplace: the posterior, its marginal likelihood, samples and predictives
  fitting.py        the curvature estimators (GGN, empirical Fisher), projected onto the commutant
  predictive.py     Jacobians, linearised and sampled-network outputs, the probit approximation, the options
See docs/laplace.md.
"""

from .approximation import SymoLaplace
from .predictive import LINK_APPROX, PRED_TYPES

__all__ = ["LINK_APPROX", "PRED_TYPES", "SymoLaplace"]
