"""The gauge paper's experiments ("The Loss Does Not See the Basis, but Adam Does"): its optimizer zoo
(`symo.experiments.zoo`, the nine update rules as torch optimizers), used by the gauge benchmarks and
the equivariance command.

Room 4 of docs/architecture.md: imports only from rooms 0 to 3.
"""

from . import zoo

__all__ = ["zoo"]
