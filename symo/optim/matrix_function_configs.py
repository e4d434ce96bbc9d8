"""Matrix functions as small frozen configs: how a kind computes a power or a polar factor of a block's statistic,
or refreshes its eigenbasis. A kind's config holds one (`backend` of polar, root and then_orthogonalize; `refresh` of
eigen_adam), and the kind calls the function it names with it (and, for a refresh, the previous factor).

    Eigh()                      exact: an eigendecomposition (of the statistic, or of the smaller Gram side of Y)
    PowerQR(iterations=1)       SOAP's eigenbasis refresh: the previous basis's columns sorted by their estimated
                                eigenvalues, one multiplication by A, then QR (eigen_adam's `refresh`)
    NewtonSchulz(steps=5)       Muon's quintic iteration for the polar factor polar(Y) = (Y Y^T)^{-1/2} Y
    CoupledNewton(steps=25)     the coupled Newton–Schulz iteration for A^{-1/2} of a stored statistic
    Auto(eigh_max_size=128)     eigh up to a Gram side of eigh_max_size, the kind's iteration above it (where
                                the kind finds it accurate); `iteration=None` is the kind's own

The kinds also take the old string spellings of `backend`: "eigh" is Eigh(), "newton_schulz" the kind's iteration
(NewtonSchulz() for the polar factor, CoupledNewton() for root's stored statistic), "auto" Auto() with it; and the
flat keywords `eigh_max_size`, `ns_steps`, `ns_coeffs`, `ns_dtype`, `ns_method`, `ns_inverse_steps` as shortcuts to
these configs' fields (each kind's `shortcuts`, kinds/options.py).

Nothing here imports torch (the presets hold these configs and are read without it); the linear algebra is
symo.runtime.linalg's, called through symo.optim.matrix_functions (`stored_power`, `current_statistic_apply`) and
eigen_adam's `first_basis` / `next_basis`. A new method is one config class here, its function, the line that calls
it, and its test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar, Literal

MUON_COEFFS = (3.4445, -4.7750, 2.0315)
"""Muon's quintic Newton–Schulz coefficients (Keller Jordan, 2024); symo.runtime.linalg.MUON_COEFFS is the same."""


class MatrixFunction:
    """Base of the configs: `label` is the backend's name in `describe()` and in the string spelling."""

    label: ClassVar[str] = ""

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                          if getattr(self, f.name) != f.default)
        return f"{type(self).__name__}({shown})"


def _int_at_least(owner: object, name: str, low: int, hint: str = "") -> None:
    value = getattr(owner, name)
    where = f"{type(owner).__name__}.{name}"
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{where} must be >= {low}, got {value!r}{hint}")


def _one_of(owner: object, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(owner, name)
    if isinstance(value, str) and value in choices:
        return
    said = ", ".join(repr(c) for c in choices)
    message = f"{type(owner).__name__}.{name} must be one of {said}; got {value!r}"
    raise ValueError(message) if isinstance(value, str) else TypeError(message)


@dataclass(frozen=True, repr=False)
class Eigh(MatrixFunction):
    """Exact: an eigendecomposition (float64 up to linalg.FLOAT64_EIGH_MAX, retried in float64 when non-finite). As
    eigen_adam's `refresh`: a fresh eigh at every refresh (columns by ascending eigenvalue; state kept per column
    stays in place)."""

    label: ClassVar[str] = "eigh"


@dataclass(frozen=True, repr=False)
class PowerQR(MatrixFunction):
    """Orthogonal (power) iteration from the previous basis, SOAP's refresh: the columns are sorted by their
    estimated eigenvalues diag(Q^T A Q), descending; then `iterations` times Q <- qr(A Q).Q, in the statistic's
    dtype. The first basis is an eigh by descending eigenvalue.

    `lift`: None multiplies by A itself (the authors' code). A number is heavyball's shifted product
    (A + c I) Q with c = max(lift, min(64 n eps_dtype, 1/8)) max |diag(Q^T A Q)|: it lifts a rank-deficient
    statistic's null space above rounding noise (heavyball passes 1e-8)."""

    label: ClassVar[str] = "power_qr"
    iterations: int = 1
    lift: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.iterations, int) or isinstance(self.iterations, bool) or self.iterations < 1:
            raise ValueError(f"PowerQR.iterations must be an int >= 1, got {self.iterations!r}")
        if self.lift is not None and not (isinstance(self.lift, (int, float)) and self.lift >= 0):
            raise ValueError(f"PowerQR.lift must be None or a number >= 0, got {self.lift!r}")


@dataclass(frozen=True, repr=False)
class NewtonSchulz(MatrixFunction):
    """Muon's iteration for the polar factor of Y (the polar kind, then_orthogonalize's last step)."""

    label: ClassVar[str] = "newton_schulz"
    steps: int = 5
    """Iterations (Muon: 5)."""
    coeffs: tuple[float, float, float] = MUON_COEFFS
    """(a, b, c) of X <- a X + (b A + c A^2) X, A = X X^T: Muon's quintic; (1.5, -0.5, 0) is the exactly
    convergent cubic."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision of the iterations (Muon runs them in bfloat16 on GPUs); input and output keep their dtype."""
    method: Literal["auto", "iterate", "spectral"] = "auto"
    """iterate: the matrix-product iteration, as Muon runs it. spectral: the same polynomial map through one eigh
    of the smaller Gram (cheaper on CPU for large or wide blocks). auto: spectral on CPU when dtype is float32 and
    linalg.spectral_ns_is_cheaper says so for the block's shape, iterate elsewhere."""

    def __post_init__(self) -> None:
        _int_at_least(self, "steps", 1, " (Muon uses 5)")
        coeffs = self.coeffs
        if not isinstance(coeffs, (tuple, list)) or not all(
                isinstance(c, (int, float)) and not isinstance(c, bool) for c in coeffs):
            raise TypeError(f"NewtonSchulz.coeffs must be a tuple of numbers, got {coeffs!r}")
        if len(coeffs) != 3 or not all(math.isfinite(c) for c in coeffs):
            raise ValueError(f"NewtonSchulz.coeffs must be three finite numbers (a, b, c), got {tuple(coeffs)!r}")
        object.__setattr__(self, "coeffs", tuple(float(c) for c in coeffs))
        _one_of(self, "dtype", ("float32", "bfloat16"))
        _one_of(self, "method", ("auto", "iterate", "spectral"))
        if self.method == "spectral" and self.dtype != "float32":
            raise ValueError("NewtonSchulz.method='spectral' evaluates Newton-Schulz through a float32/float64 eigh; "
                             "NewtonSchulz.dtype='bfloat16' applies to the iteration only: use "
                             "NewtonSchulz.method='iterate' (or 'auto') with bfloat16")


@dataclass(frozen=True, repr=False)
class CoupledNewton(MatrixFunction):
    """The coupled Newton–Schulz iteration for A^{-1/2} of a stored statistic A (power -1/2 only; it runs where its
    damping makes it accurate, linalg.ns_inverse_root_is_accurate, and eigh takes the block elsewhere)."""

    label: ClassVar[str] = "newton_schulz"
    steps: int = 25
    """Iterations."""

    def __post_init__(self) -> None:
        _int_at_least(self, "steps", 1, " (25 reaches float64 accuracy at relative damping 1e-6)")


@dataclass(frozen=True, repr=False)
class Auto(MatrixFunction):
    """Eigh for blocks whose Gram side is at most `eigh_max_size`, the iteration above it (root: only where the
    iteration is also cheaper and accurate; its kind's `backend` docstring says where)."""

    label: ClassVar[str] = "auto"
    eigh_max_size: int = 128
    """The largest Gram side solved by eigh."""
    iteration: NewtonSchulz | CoupledNewton | None = None
    """The iteration above eigh_max_size; None: the kind's own (NewtonSchulz() for a polar factor, CoupledNewton()
    for a stored statistic)."""

    def __post_init__(self) -> None:
        _int_at_least(self, "eigh_max_size", 1)
        if self.iteration is not None and not isinstance(self.iteration, (NewtonSchulz, CoupledNewton)):
            raise TypeError(f"Auto.iteration must be None, NewtonSchulz(...) or CoupledNewton(...), "
                            f"got {self.iteration!r}")


BasisRefresh = Eigh | PowerQR
"""The refresh methods an eigenbasis kind accepts (its `refresh` option)."""

SPELLINGS = ("auto", "eigh", "newton_schulz")
"""The string spellings of a kind's `backend`."""


def iteration_of(value: MatrixFunction) -> NewtonSchulz | CoupledNewton | None:
    """The iteration a backend config holds: itself, Auto's, or None (Eigh)."""
    if isinstance(value, (NewtonSchulz, CoupledNewton)):
        return value
    return value.iteration if isinstance(value, Auto) else None


def spelled(value: object, iteration: type[NewtonSchulz] | type[CoupledNewton],
            previous: object = None) -> object:
    """A kind's `backend` as a config: a string spelling (SPELLINGS) becomes Eigh(), the kind's `iteration` or
    Auto() with it, keeping the iteration's and Auto's settings of `previous` (the value it replaces); an Auto
    without an iteration gets the kind's. Any other value is returned as it is (the kind's config checks it)."""
    before = iteration_of(previous) if isinstance(previous, MatrixFunction) else None
    kept = before if isinstance(before, iteration) else iteration()
    if value == "eigh" and isinstance(value, str):
        return Eigh()
    if value == "newton_schulz" and isinstance(value, str):
        return kept
    if value == "auto" and isinstance(value, str):
        return Auto(eigh_max_size=previous.eigh_max_size if isinstance(previous, Auto) else 128, iteration=kept)
    if isinstance(value, Auto) and value.iteration is None:
        return Auto(eigh_max_size=value.eigh_max_size, iteration=iteration())
    return value


__all__ = ["MUON_COEFFS", "SPELLINGS", "Auto", "BasisRefresh", "CoupledNewton", "Eigh", "MatrixFunction",
           "NewtonSchulz", "PowerQR", "iteration_of", "spelled"]
