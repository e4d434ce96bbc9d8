"""Eigenbasis refreshes as small frozen configs: how a kind that rotates into a statistic's eigenbasis (eigen_adam,
SOAP) recomputes that basis from the statistic and the previous basis.

    Eigh()                   a fresh eigendecomposition each time (columns by ascending eigenvalue)
    PowerQR(iterations=1)    SOAP's refresh: the previous basis's columns sorted by their estimated eigenvalues
                             Q^T A Q (descending), one multiplication by A, then QR; Adam's second moment follows
                             its column through the sort

A config names the method and its parameters, and nothing here imports torch (the presets hold these configs
and are read without it); the linear algebra is symo.runtime.linalg's (`eigh_basis`, `power_qr_basis`), which
eigen_adam calls through its `first_basis` and `next_basis`. A new refresh method is one config class here, its
function in linalg.py, one line in each of those two, and its test.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Eigh:
    """A fresh eigh at every refresh (columns by ascending eigenvalue; state kept per column stays in place)."""


@dataclass(frozen=True)
class PowerQR:
    """Orthogonal (power) iteration from the previous basis, SOAP's refresh: the columns are sorted by their
    estimated eigenvalues diag(Q^T A Q), descending; then `iterations` times Q <- qr(A Q).Q, in the statistic's
    dtype. The first basis is an eigh by descending eigenvalue.

    `lift`: None multiplies by A itself (the authors' code). A number is heavyball's shifted product
    (A + c I) Q with c = max(lift, min(64 n eps_dtype, 1/8)) max |diag(Q^T A Q)|: it lifts a rank-deficient
    statistic's null space above rounding noise (heavyball passes 1e-8)."""

    iterations: int = 1
    lift: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.iterations, int) or isinstance(self.iterations, bool) or self.iterations < 1:
            raise ValueError(f"PowerQR.iterations must be an int >= 1, got {self.iterations!r}")
        if self.lift is not None and not (isinstance(self.lift, (int, float)) and self.lift >= 0):
            raise ValueError(f"PowerQR.lift must be None or a number >= 0, got {self.lift!r}")


BasisRefresh = Eigh | PowerQR
"""The refresh methods an eigenbasis kind accepts (its `refresh` option)."""


__all__ = ["BasisRefresh", "Eigh", "PowerQR"]
