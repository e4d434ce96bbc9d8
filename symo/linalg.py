"""Matrix functions of the small symmetric factors: exact (eigh) and Newton–Schulz.

Conventions of MATH.md §3: damping is relative, x -> x + damping * lambda_max per block; eigenvalues
that are zero to working precision map to zero (pseudo-inverse semantics), so a rank-deficient
single-gradient S still has a well-defined S^{-1/2} on its support.
"""

from __future__ import annotations

import torch

# eigh runs in float64 up to this size (cheap and exact); larger blocks stay in their own dtype and
# retry in float64 only if the float32 solver fails to converge.
FLOAT64_EIGH_MAX = 512

# Muon's quintic Newton–Schulz coefficients (Keller Jordan, 2024).
MUON_COEFFS = (3.4445, -4.7750, 2.0315)


def _eigh(a: torch.Tensor, float64_max: int = FLOAT64_EIGH_MAX) -> tuple[torch.Tensor, torch.Tensor]:
    work = torch.float64 if a.shape[-1] <= float64_max else torch.float32
    try:
        return torch.linalg.eigh(a.to(work))
    except RuntimeError:  # ill-conditioned input that the float32 solver did not converge on
        return torch.linalg.eigh(a.to(torch.float64))


def _zero_tol(evals: torch.Tensor, size: int, dtype: torch.dtype) -> torch.Tensor:
    """Eigenvalues at or below this are exact zeros: size * eps of the data's precision * lambda_max."""
    lam_max = evals.amax(dim=-1, keepdim=True).clamp_min(0)
    return lam_max * size * torch.finfo(dtype).eps, lam_max


def spectral_fn(evals: torch.Tensor, p: float, damping: float, size: int, dtype: torch.dtype) -> torch.Tensor:
    """f(x) = (x + damping * lambda_max)^p on the support, 0 off it."""
    tol, lam_max = _zero_tol(evals, size, dtype)
    keep = evals > tol
    shifted = torch.where(keep, evals + damping * lam_max, torch.ones_like(evals))
    return torch.where(keep, shifted.pow(p), torch.zeros_like(evals))


def sym_power(a: torch.Tensor, p: float, damping: float = 0.0,
              float64_max: int = FLOAT64_EIGH_MAX) -> torch.Tensor:
    """A^p for a batch of symmetric PSD matrices (..., m, m), through eigh."""
    evals, evecs = _eigh(a, float64_max)
    f = spectral_fn(evals, p, damping, a.shape[-1], a.dtype)
    return ((evecs * f.unsqueeze(-2)) @ evecs.transpose(-1, -2)).to(a.dtype)


def root_power(f: torch.Tensor, p: float, damping: float = 0.0,
               float64_max: int = FLOAT64_EIGH_MAX) -> torch.Tensor:
    """For S = F F^T with F (..., m, r), r < m: a root F' with S^p = F' F'^T, using only the r x r Gram.

    F^T F = W L W^T, so S = (F W L^{-1/2}) L (F W L^{-1/2})^T and S^p has the root F W (f(L) / L)^{1/2}.
    """
    gram = f.transpose(-1, -2) @ f
    evals, evecs = _eigh(gram, float64_max)
    fl = spectral_fn(evals, p, damping, max(f.shape[-2], f.shape[-1]), f.dtype)
    scale = torch.where(fl > 0, (fl / evals.clamp_min(torch.finfo(evals.dtype).tiny)).sqrt(),
                        torch.zeros_like(fl))
    return f @ (evecs * scale.unsqueeze(-2)).to(f.dtype)


def newton_schulz(x: torch.Tensor, steps: int = 5, coeffs: tuple[float, float, float] = MUON_COEFFS,
                  eps: float = 1e-7) -> torch.Tensor:
    """Approximate polar factor U V^T of x (..., m, n) by Muon's quintic iteration.

    Muon's coefficients do not converge to the polar factor exactly: singular values land in roughly
    [0.7, 1.2], which is what Muon uses and what the `"newton_schulz"` backend reproduces.
    """
    a, b, c = coeffs
    transpose = x.shape[-2] > x.shape[-1]
    y = x.transpose(-1, -2) if transpose else x
    y = y / (y.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        gram = y @ y.transpose(-1, -2)
        poly = b * gram + c * gram @ gram
        y = a * y + poly @ y
    return y.transpose(-1, -2) if transpose else y
