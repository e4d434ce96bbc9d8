"""Stage 3, structure: `BoundSpec` -> `Structure`, the isotypic decomposition of docs/theory.md (tier 1).

Every space splits R^n into irreducible pieces: `perm` into trivial (J/n) and standard (I - J/n),
`signed_perm` and `orthogonal` stay whole ("nat"), `identity` is multiplicity. A *component* of a
block picks one piece per group axis; its *label* is the set of non-trivial pieces (a trivial piece
counts as the space's absence, which is how W2's column means couple with parameters that never see
the space). All components of one label stack into Y_lambda (multiplicity x width) and

    S_g on lambda = (Y Y^T / d_lambda) (x) I,   d_lambda = prod (n - 1 for std, n for nat).

Every size (d_lambda, multiplicities, row offsets, the trivial-piece normalisers 1/sqrt(n)) is a
sympy expression in size symbols, never a number: the structure, and the code generated from it,
serve every width; sizes are bound only when the generated module is loaded.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import sympy

from .validate import BoundSpec

TRIV, STD, NAT = "triv", "std", "nat"


@dataclass(frozen=True)
class Component:
    """One component of one block: how to turn the block into rows of Y_lambda and back.

    `pieces[k]` is the piece chosen for atom k (None for multiplicity atoms); after contracting the
    trivial atoms, the remaining atoms are permuted by `order` into (batch, multiplicity, columns).
    Every size is a sympy expression in the size symbols (n_<space>, f<param>_<axis>_<segment>).
    """

    param: str
    block: int
    pieces: tuple[str | None, ...]
    order: tuple[int, ...]
    batch_shape: tuple[sympy.Expr, ...]
    mult_shape: tuple[sympy.Expr, ...]
    col_shape: tuple[sympy.Expr, ...]
    row_offset: sympy.Expr
    rows: sympy.Expr
    triv_norm: sympy.Expr  # 1/sqrt(prod n) over the contracted trivial pieces


@dataclass(frozen=True)
class IsotypicBlock:
    """One label lambda: Y_lambda has shape (batch, mult, width) and S = (Y Y^T / dim) (x) I.
    The four sizes are sympy expressions; `CompiledSpec.blocks` holds their values."""

    id: str
    label: tuple[tuple[str, str], ...]
    batch_spaces: tuple[str, ...]
    batch: sympy.Expr
    mult: sympy.Expr
    cols: tuple[str, ...]
    width: sympy.Expr
    dim: sympy.Expr
    components: tuple[Component, ...]

    @property
    def name(self) -> str:
        if not self.label:
            return "trivial"
        text = " x ".join(f"{piece}({space})" for space, piece in self.label)
        return text + (f" per {'x'.join(self.batch_spaces)}" if self.batch_spaces else "")


@dataclass(frozen=True)
class Structure:
    bound: BoundSpec
    blocks: tuple[IsotypicBlock, ...]


def symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True, integer=True)


def derive_structure(bound: BoundSpec) -> Structure:
    """Enumerate components, group them by label, and write every size as an expression."""
    spaces = bound.spaces
    rank = {s: i for i, s in enumerate(spaces)}
    n = {s: symbol(sp.symbol) for s, sp in spaces.items()}
    groups: dict[tuple, list] = {}
    for param in bound.params:
        for block in param.blocks:
            atoms = block.atoms
            choices = []
            for atom in atoms:
                group = spaces[atom.space].group if atom.space else "identity"
                pieces = {"perm": (STD, TRIV), "signed_perm": (NAT,), "orthogonal": (NAT,),
                          "identity": (None,)}[group]
                if group == "perm" and atom.size == 1:  # S_1: the standard piece is empty
                    pieces = (TRIV,)
                choices.append(pieces)
            for pieces in itertools.product(*choices):
                label = tuple(sorted(((atoms[k].space, p) for k, p in enumerate(pieces) if p in (STD, NAT)),
                                     key=lambda sp: rank[sp[0]]))
                batch_spaces = tuple(sorted({spaces[s].per for s, _ in label if spaces[s].per},
                                            key=rank.__getitem__))
                groups.setdefault((label, batch_spaces), []).append((param.name, block, pieces))

    blocks = []
    for i, ((label, batch_spaces), members) in enumerate(groups.items()):
        cols = tuple(s for s, _ in label)
        comps, offset = [], sympy.Integer(0)
        for pname, block, pieces in members:
            atoms = block.atoms
            size = [symbol(a.symbol) for a in atoms]
            kept = [k for k, p in enumerate(pieces) if p != TRIV]
            batch_pos = [next(k for k in kept if atoms[k].space == b) for b in batch_spaces]
            col_pos = [next(k for k in kept if atoms[k].space == s) for s in cols]
            mult_pos = [k for k in kept if k not in batch_pos and k not in col_pos]
            rows = sympy.Mul(*[size[k] for k in mult_pos])
            comps.append(Component(
                param=pname, block=block.index, pieces=pieces,
                order=tuple(kept.index(k) for k in batch_pos + mult_pos + col_pos),
                batch_shape=tuple(size[k] for k in batch_pos),
                mult_shape=tuple(size[k] for k in mult_pos),
                col_shape=tuple(size[k] for k in col_pos),
                row_offset=offset, rows=rows,
                triv_norm=1 / sympy.sqrt(sympy.Mul(*[size[k] for k, p in enumerate(pieces) if p == TRIV]))))
            offset = offset + rows
        blocks.append(IsotypicBlock(
            id=f"L{i}", label=label, batch_spaces=batch_spaces, batch=sympy.Mul(*[n[b] for b in batch_spaces]),
            mult=offset, cols=cols, width=sympy.Mul(*[n[s] for s in cols]),
            dim=sympy.Mul(*[n[s] - 1 if p == STD else n[s] for s, p in label]), components=tuple(comps)))
    return Structure(bound=bound, blocks=tuple(blocks))
