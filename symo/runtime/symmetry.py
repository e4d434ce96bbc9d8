"""Telling a true symmetry from a relaxed one: does the loss see the group?"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
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
    with torch.no_grad(), _dtype_hint(dtype):
        base = float(loss_fn(w))
        worst = 0.0
        for _ in range(trials):
            g = compiled.random_element(gen, dtype=dtype)
            moved = float(loss_fn(compiled.act(g, w)))
            worst = max(worst, abs(moved - base) / max(abs(base), 1e-30))
    return SymmetryReport(trials=trials, max_rel_change=worst, tolerance=tol)


@contextlib.contextmanager
def _dtype_hint(dtype: torch.dtype) -> Iterator[None]:
    """Turn the dtype mismatch of a loss that mixes the parameters with tensors of another dtype (float64
    parameters and a float32 model or data, or the reverse) into a message saying what to change, as
    `symo.hessian.dense` does."""
    try:
        yield
    except RuntimeError as exc:
        if "dtype" not in str(exc) and "Double" not in str(exc):
            raise
        name = str(dtype).removeprefix("torch.")
        raise TypeError(
            f"loss_fn failed with the parameters in {name} ({exc}). check_symmetry evaluates the loss at the "
            "parameters as given and at moved copies of the same dtype, so everything the loss combines with them "
            f"must be {name} too: cast the data (and a model called through torch.func.functional_call) to {name}, "
            "or pass the parameters in the dtype of the model and data") from None
