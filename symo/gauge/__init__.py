"""Does an optimizer respect a symmetry of the loss? `check_equivariance` trains twins w and A w in
lockstep and reports how far A w_t drifts from w'_t (docs/gauge.md).

    report = symo.check_equivariance(lambda ps: torch.optim.Adam(ps, lr=1e-2))   # factored problem
    print(report.summary())

Room 3 of docs/architecture.md: imports only from `symo.compiler` (room 0) and `symo.runtime` (room 1).
  equivariance.py  check_equivariance and its EquivarianceReport
  problems.py      factored_problem, the default problem (W = U V^T with its O(k) gauge)
"""

from .equivariance import EquivarianceReport, check_equivariance
from .problems import factored_problem

__all__ = ["EquivarianceReport", "check_equivariance", "factored_problem"]
