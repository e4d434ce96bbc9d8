"""Telling a true symmetry from a relaxed one: does the loss see the group?"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .compiled import CompiledSpec


@dataclass(frozen=True)
class SymmetryReport:
    """`max_rel_change` = max over trials of |L(A_g w) - L(w)| / max(|L(w)|, tiny); `is_true_symmetry` is
    the verdict (`max_rel_change <= tolerance`), and `str(report)` says it in one line."""

    trials: int
    max_rel_change: float
    tolerance: float

    @property
    def is_true_symmetry(self) -> bool:
        """The verdict: the loss changed by at most `tolerance` (relative) under every trial element."""
        return self.max_rel_change <= self.tolerance

    def __str__(self) -> str:
        verdict = "true symmetry" if self.is_true_symmetry else "not a true symmetry (relaxed)"
        return (f"{verdict}: the loss changed by at most {self.max_rel_change:.1e} (relative) over {self.trials} "
                f"random group element{'s' if self.trials != 1 else ''} (tolerance {self.tolerance:.1e})")


def check_symmetry(loss_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor], compiled: CompiledSpec,
                   params: Mapping[str, torch.Tensor], *, trials: int = 4, tolerance: float | None = None,
                   seed: int = 0) -> SymmetryReport:
    """Evaluate L(A_g w) against L(w) for random group elements g (docs/theory.md, "true symmetry").

    A relaxed group (Muon's per-matrix rows, a signed_perm on a GELU layer) shows a relative change
    far above float tolerance; a true one stays at rounding level.
    """
    gen = torch.Generator().manual_seed(seed)
    w = {k: v.detach() for k, v in params.items()}
    dtype = next(iter(w.values())).dtype
    tol = tolerance if tolerance is not None else 1e3 * torch.finfo(dtype).eps
    with torch.no_grad():
        base = float(loss_fn(w))
        worst = 0.0
        for _ in range(trials):
            g = compiled.random_element(gen, dtype=dtype)
            moved = float(loss_fn(compiled.act(g, w)))
            worst = max(worst, abs(moved - base) / max(abs(base), 1e-30))
    return SymmetryReport(trials=trials, max_rel_change=worst, tolerance=tol)
