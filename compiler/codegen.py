"""Stage 4, code: `Structure` -> `GeneratedCode`, the source of a small PyTorch module.

The module defines
    gather(t)  : {param: tensor}           -> {block id: Y_lambda of shape (batch, mult, width)}
    scatter(z) : {block id: Z_lambda}      -> {param: tensor}   (the transpose of gather)
and BLOCKS, the blocks' sizes. gather is the orthogonal change of coordinates of docs/theory.md, so
scatter(gather(t)) == t for every covered parameter. The code is straight-line torch (narrow,
reshape, permute, mean, sum, cat): readable, vmap-able and free of graph breaks under torch.compile.

This module covers layouts in which every space occurs at most once per block, one piece per atom
(`PieceMaps`); compiler.codegen_template loops over families of identical layers with the same
maps, and compiler.codegen_repeated handles spaces that repeat within one tensor. All three write
through compiler.emit.

Sizes are never numbers in the source: each is a sympy expression printed in the size identifiers
(n_<space>, d_<parameter>_dim<axis>), which the module reads from `N` when it is loaded. So one
generated module serves every width, and only loading binds the sizes.
"""

from __future__ import annotations

from .emit import STD_HELPER, GeneratedCode, code, dims, from_rows, per_parameter_module, to_rows
from .structure import STD, TRIV, Component, IsotypicBlock, Structure


class PieceMaps:
    """One piece per atom: the standard piece of a perm space is a projection (remove the mean
    along the atom), a trivial piece a contraction (sum / sqrt(n)), nat and multiplicity atoms
    pass through; then the atoms are permuted into (batch, mult, width)."""

    def tag(self, c: Component) -> str:
        return "".join((p or "_")[0] for p in c.pieces)

    def gather(self, var: str, c: Component, ib: IsotypicBlock) -> str:
        expr = var
        for k in (k for k, p in enumerate(c.pieces) if p == STD):
            expr = f"_std({expr}, {k})"
        triv = [k for k, p in enumerate(c.pieces) if p == TRIV]
        if triv:
            expr = f"({expr}.sum(dim={dims(triv)}) * ({code(c.triv_norm)}))"
        if list(c.order) != sorted(c.order):
            expr = f"{expr}.permute{tuple(c.order)!r}"
        return to_rows(expr, (c.batch_shape, c.mult_shape, c.col_shape), (ib.batch, c.rows, ib.width))

    def scatter(self, rows: str, c: Component) -> tuple[str, bool]:
        expr = from_rows(rows, (c.batch_shape, c.mult_shape, c.col_shape))
        inverse = tuple(sorted(range(len(c.order)), key=lambda i: c.order[i]))
        if list(inverse) != sorted(inverse):
            expr += f".permute{inverse!r}"
        triv = [k for k, p in enumerate(c.pieces) if p == TRIV]
        for k in triv:  # ascending, so each unsqueeze restores the original position
            expr += f".unsqueeze({k})"
        if triv:
            expr = f"({expr} * ({code(c.triv_norm)}))"
        for k, p in enumerate(c.pieces):
            if p == STD:
                expr = f"_std({expr}, {k})"
        return expr, not triv


PIECES = PieceMaps()


def generate(structure: Structure, key: str) -> GeneratedCode:
    return GeneratedCode(key=key, source=per_parameter_module(structure, key, "layer by layer", PIECES, [STD_HELPER]))
