"""Eigenbasis refreshes as small frozen configs: how a kind that rotates into a statistic's eigenbasis (eigen_adam,
SOAP) recomputes that basis from the statistic and the previous basis.

    Eigh()                   a fresh eigendecomposition each time (columns by ascending eigenvalue)
    PowerQR(iterations=1)    SOAP's refresh: the previous basis's columns sorted by their estimated eigenvalues
                             Q^T A Q (descending), one multiplication by A, then QR; Adam's second moment follows
                             its column through the sort

Each is called as `refresh.basis(average, previous)` on a batch of statistics (batch, n, n) and returns the new
basis and, where the columns were reordered, the order (batch, n) that the kind applies to the state it keeps per
column (None: columns keep their positions). A block's first basis is `refresh.first(average)`, an eigh.
A new refresh method is one class here with a `basis` method, plus its test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def first_basis(average: torch.Tensor) -> torch.Tensor:
    """The eigenvectors of a batch of symmetric statistics, by descending eigenvalue (SOAP's first basis), the
    decomposition in float64 and the result in the statistic's dtype."""
    _, evecs = torch.linalg.eigh(average.to(torch.float64))
    return evecs.flip(-1).to(average.dtype)


@dataclass(frozen=True)
class Eigh:
    """A fresh eigh at every refresh (columns by ascending eigenvalue; state kept per column stays in place)."""

    def first(self, average: torch.Tensor) -> torch.Tensor:
        """The first basis: the same eigh, so that later refreshes keep each column's position."""
        return self.basis(average, average)[0]

    def basis(self, average: torch.Tensor, previous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        _, evecs = torch.linalg.eigh(average.to(torch.float64))
        return evecs.to(average.dtype), None


@dataclass(frozen=True)
class PowerQR:
    """Orthogonal (power) iteration from the previous basis, SOAP's refresh: the columns are sorted by their
    estimated eigenvalues diag(Q^T A Q), descending; then `iterations` times Q <- qr(A Q).Q. The QR runs in the
    statistic's dtype.

    `lift`: None multiplies by A itself (the authors' code). A number is heavyball's shifted product
    (A + c I) Q with c = max(lift, min(64 n eps_dtype, 1/8)) max |diag(Q^T A Q)|: it lifts a rank-deficient
    statistic's null space above rounding noise (heavyball passes its Adam eps as `lift`)."""

    iterations: int = 1
    lift: float | None = None

    def first(self, average: torch.Tensor) -> torch.Tensor:
        """The first basis: an eigh, columns by descending eigenvalue (SOAP)."""
        return first_basis(average)

    def __post_init__(self) -> None:
        if not isinstance(self.iterations, int) or isinstance(self.iterations, bool) or self.iterations < 1:
            raise ValueError(f"PowerQR.iterations must be an int >= 1, got {self.iterations!r}")
        if self.lift is not None and not (isinstance(self.lift, (int, float)) and self.lift >= 0):
            raise ValueError(f"PowerQR.lift must be None or a number >= 0, got {self.lift!r}")

    def basis(self, average: torch.Tensor, previous: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        q = previous.to(average.dtype)
        product = average @ q
        estimate = (q * product).sum(dim=-2)
        order = torch.argsort(estimate, dim=-1, descending=True)
        if self.lift is not None:
            noise = min(64 * average.shape[-1] * torch.finfo(average.dtype).eps, 0.125)
            top = estimate.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(average.dtype).tiny)
            product = product + (max(self.lift, noise) * top).unsqueeze(-2) * q
        product = product.gather(-1, order.unsqueeze(-2).expand_as(product))
        q = torch.linalg.qr(product).Q
        for _ in range(self.iterations - 1):
            q = torch.linalg.qr(average @ q).Q
        return q, order


BasisRefresh = Eigh | PowerQR
"""The refresh methods an eigenbasis kind accepts (its `refresh` option)."""

__all__ = ["BasisRefresh", "Eigh", "PowerQR", "first_basis"]
