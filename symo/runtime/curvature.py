"""`Curvature`: an element of the commutant algebra, stored as a few small factors.

For each isotypic block lambda the operator is (A_lambda (x) I) in the block's coordinates, and
A_lambda is kept either dense (batch, mult, mult) or, when it has low rank, as a root F with
A = F F^T (batch, mult, r). A single gradient gives the root Y / sqrt(d) whenever the block is wider
in multiplicity than in columns; sums of roots stay roots until the rank would reach the
multiplicity. The P x P matrix is never formed except by `dense()`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from .linalg import root_power, sym_power

if TYPE_CHECKING:
    from .compiled import CompiledSpec

Tensors = Mapping[str, torch.Tensor]


class Curvature:
    """S = sum over blocks of C_lambda^T (A_lambda (x) I) C_lambda, with C the compiled coordinates."""

    def __init__(self, compiled: CompiledSpec, dense: dict[str, torch.Tensor] | None = None,
                 roots: dict[str, torch.Tensor] | None = None) -> None:
        self.compiled = compiled
        self.dense_factors: dict[str, torch.Tensor] = dict(dense or {})
        self.root_factors: dict[str, torch.Tensor] = dict(roots or {})

    # ---------------------------------------------------------------- factors
    def factor(self, block_id: str) -> torch.Tensor:
        """A_lambda as a dense (batch, mult, mult) tensor."""
        if block_id in self.dense_factors:
            return self.dense_factors[block_id]
        f = self.root_factors[block_id]
        return f @ f.transpose(-1, -2)

    @property
    def block_ids(self) -> list[str]:
        return [b for b in self.compiled.block_ids if b in self.dense_factors or b in self.root_factors]

    def numel(self) -> int:
        """Stored numbers: the memory of this representation."""
        return sum(t.numel() for t in (*self.dense_factors.values(), *self.root_factors.values()))

    # ---------------------------------------------------------------- action
    def apply_blocks(self, ys: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """(A_lambda Y_lambda) for coordinates already gathered: the hot path of the optimizer."""
        out = {}
        for b, y in ys.items():
            if b in self.dense_factors:
                out[b] = self.dense_factors[b].to(y.dtype) @ y
            elif b in self.root_factors:
                f = self.root_factors[b].to(y.dtype)
                out[b] = f @ (f.transpose(-1, -2) @ y)
            else:
                out[b] = torch.zeros_like(y)
        return out

    def matvec(self, v: Tensors) -> dict[str, torch.Tensor]:
        """S v for a dict of tensors shaped like the covered parameters."""
        return self.compiled.scatter(self.apply_blocks(self.compiled.gather(v)))

    def power(self, p: float, damping: float = 0.0) -> Curvature:
        """S^p blockwise, with relative damping and pseudo-inverse semantics on exact zeros."""
        dense = {b: sym_power(a, p, damping) for b, a in self.dense_factors.items()}
        roots = {b: root_power(f, p, damping) for b, f in self.root_factors.items()}
        return Curvature(self.compiled, dense, roots)

    def dense(self) -> torch.Tensor:
        """The P x P matrix in `param_names` order, each tensor row-major (small problems only)."""
        c = self.compiled
        sizes = [math.prod(c.shapes[n]) for n in c.param_names]
        ref = next(iter((*self.dense_factors.values(), *self.root_factors.values())), None)
        dtype = ref.dtype if ref is not None else torch.get_default_dtype()
        device = ref.device if ref is not None else None
        eye = torch.eye(sum(sizes), dtype=dtype, device=device)
        basis = dict(zip(c.param_names, (col.reshape(-1, *c.shapes[n]) for n, col in
                                         zip(c.param_names, eye.split(sizes, dim=1)))))
        out = torch.func.vmap(self.matvec)(basis)
        return torch.cat([out[n].reshape(eye.shape[0], -1) for n in c.param_names], dim=1).T

    # ---------------------------------------------------------------- algebra
    def _combine(self, other: Curvature, sign: float) -> Curvature:
        if not self.compiled.same_binding(other.compiled):
            raise ValueError("cannot add curvatures compiled from different specs or shapes")
        dense, roots = {}, {}
        for b in self.compiled.block_ids:
            mine, theirs = self._get(b), other._get(b)
            if theirs is None:
                if mine is not None:
                    (dense if b in self.dense_factors else roots)[b] = mine
                continue
            if mine is None and sign > 0:
                (dense if b in other.dense_factors else roots)[b] = theirs
                continue
            both_roots = b in self.root_factors and b in other.root_factors and sign > 0
            if both_roots and mine.shape[-1] + theirs.shape[-1] < mine.shape[-2]:
                roots[b] = torch.cat([mine, theirs], dim=-1)
            else:
                a = self.factor(b) if mine is not None else 0
                dense[b] = a + sign * other.factor(b)
        return Curvature(self.compiled, dense, roots)

    def _get(self, b: str) -> torch.Tensor | None:
        return self.dense_factors.get(b, self.root_factors.get(b))

    def __add__(self, other: Curvature) -> Curvature:
        if not isinstance(other, Curvature):
            return NotImplemented
        return self._combine(other, 1.0)

    def __sub__(self, other: Curvature) -> Curvature:
        if not isinstance(other, Curvature):
            return NotImplemented
        return self._combine(other, -1.0)

    def __mul__(self, scalar: float) -> Curvature:
        if isinstance(scalar, torch.Tensor):
            scalar = float(scalar)
        if not isinstance(scalar, (int, float)):
            return NotImplemented
        dense = {b: a * scalar for b, a in self.dense_factors.items()}
        if scalar >= 0:
            roots = {b: f * math.sqrt(scalar) for b, f in self.root_factors.items()}
        else:
            roots = {}
            dense.update({b: scalar * (f @ f.transpose(-1, -2)) for b, f in self.root_factors.items()})
        return Curvature(self.compiled, dense, roots)

    __rmul__ = __mul__

    def __neg__(self) -> Curvature:
        return self * -1.0

    def __truediv__(self, scalar: float) -> Curvature:
        return self * (1.0 / scalar)

    def to(self, *args, **kwargs) -> Curvature:
        return Curvature(self.compiled, {b: a.to(*args, **kwargs) for b, a in self.dense_factors.items()},
                         {b: f.to(*args, **kwargs) for b, f in self.root_factors.items()})

    def __repr__(self) -> str:
        return (f"Curvature({self.compiled.name!r}, {len(self.dense_factors)} dense + "
                f"{len(self.root_factors)} low-rank blocks, {self.numel()} numbers)")

