"""Stage 3, structure: `BoundSpec` -> `Structure`, the isotypic decomposition of docs/theory.md for
layouts in which every space occurs at most once per block (compiler.repeated handles the others).

Every space splits R^n into irreducible pieces: `perm` into trivial (J/n) and standard (I - J/n),
`signed_perm` and `orthogonal` stay whole ("nat"), `identity` is multiplicity. A *component* of a
block picks one piece per group axis; its *label* is the set of non-trivial pieces (a trivial piece
counts as the space's absence, which is how W2's column means couple with parameters that never see
the space). A `per` space under an identity owner is batched over the owner (one block per head);
under a perm or signed_perm owner, the owner axis joins the label as the piece `ind` (`block_pieces`).
All components of one label stack into Y_lambda (multiplicity x width) and

    S_g on lambda = (Y Y^T / d_lambda) (x) I,   d_lambda = prod (n - 1 for std, n for nat and ind).

Every size (d_lambda, multiplicities, row offsets, the trivial-piece normalisers 1/sqrt(n)) is a
sympy expression in size symbols, never a number: the structure, and the code generated from it,
serve every width; sizes are bound only when the generated module is loaded.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import sympy

from .bound import BoundSpec

TRIV, STD, NAT = "triv", "std", "nat"
# The piece of a perm or signed_perm owner whose per-spaces in the block carry a non-trivial piece: the
# owner's indices (heads) permuted as wholes, each carrying its own element of the per-spaces, make the
# owner axis and those per-space axes together one irreducible, induced from one head's piece
# (dimension n_owner x the per-space pieces' dimensions); its statistic pools the heads' blocks.
IND = "ind"


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
    # row offsets and the multiplicity of a block with several components are symbols (_oL0_3, _mL0)
    # defined by these running sums, each on its predecessor: an offset written out in full would
    # be a sum over every earlier component, and printing those is quadratic in depth.
    offset_defs: tuple[tuple[sympy.Symbol, sympy.Expr, sympy.Expr], ...] = ()  # (symbol, previous, rows)

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


def pycode(expr, names: dict | None = None) -> str:
    """Python source for a size expression; `names` renames symbols (Symbol -> identifier).

    Products of symbols and integers (almost every size) are printed directly: sympy's printer
    costs ~0.2 ms a call, which dominated compile time on deep specs. Anything else goes through
    sympy.pycode, with the same renaming."""
    expr = sympy.sympify(expr)
    fast = _fast_code(expr, names or {})
    if fast is not None:
        return fast
    if names:
        expr = expr.xreplace({s: sympy.Symbol(v, positive=True, integer=True) for s, v in names.items()
                              if s in expr.free_symbols})
    return sympy.pycode(expr)


def running_offsets(block_id: str, rows: list[sympy.Expr]) -> tuple[list, sympy.Expr, tuple]:
    """Row offsets of consecutive components and the total, as symbols defined by running sums.

    Returns (offsets, mult, defs): offsets[0] is 0; each definition (symbol, previous, rows) means
    symbol = previous + rows (kept apart: building the sympy Add costs more than printing it); with
    one component mult is its rows and there are no definitions."""
    if len(rows) <= 1:
        return [sympy.Integer(0)] * len(rows), (rows[0] if rows else sympy.Integer(0)), ()
    offsets: list[sympy.Expr] = [sympy.Integer(0)]
    defs = []
    for k in range(1, len(rows)):
        sym = sympy.Symbol(f"_o{block_id}_{k}", integer=True, nonnegative=True)
        defs.append((sym, offsets[-1], rows[k - 1]))
        offsets.append(sym)
    mult = sympy.Symbol(f"_m{block_id}", integer=True, positive=True)
    defs.append((mult, offsets[-1], rows[-1]))
    return offsets, mult, tuple(defs)


def _fast_code(expr, names: dict) -> str | None:
    """Sums of products of symbols and integers, printed without sympy's printer; None otherwise."""
    if expr.is_Integer:
        return str(int(expr))
    if expr.is_Symbol:
        return names.get(expr, expr.name)
    if expr.is_Mul:
        if not all(f.is_Symbol or (f.is_Integer and f > 0) for f in expr.args):
            return None
        ints = [str(int(f)) for f in expr.args if f.is_Integer]
        return "*".join(ints + sorted(names.get(f, f.name) for f in expr.args if f.is_Symbol))
    if expr.is_Pow and expr.exp == sympy.Rational(-1, 2) and (expr.base.is_Symbol or expr.base.is_Mul):
        base = _fast_code(expr.base, names)  # the trivial pieces' normaliser 1/sqrt(n)
        return None if base is None else f"1/math.sqrt({base})"
    if expr.is_Add:
        terms, const = [], 0
        for term in _flat_terms(expr):
            if term.is_Integer:
                const += int(term)
                continue
            code = _fast_code(term, names)
            if code is None:
                return None
            terms.append(code)
        if const:
            terms.append(str(const))
        return " + ".join(terms).replace("+ -", "- ") if terms else "0"
    return None


def _flat_terms(expr):
    for term in expr.args:
        if term.is_Add:
            yield from _flat_terms(term)
        else:
            yield term


_PIECES = {"perm": (STD, TRIV), "signed_perm": (NAT,), "orthogonal": (NAT,), "identity": (None,)}


def single_pieces(group: str, size: int) -> tuple[str | None, ...]:
    """The irreducible pieces of R^n under `group` (None: multiplicity, no group acts)."""
    if group == "perm" and size == 1:  # S_1: the standard piece is empty
        return (TRIV,)
    return _PIECES[group]


def label_groups(bound: BoundSpec) -> dict[tuple, list]:
    """Every component (param, block, pieces) grouped by its (label, batch spaces), in order of first
    appearance over the parameters: the order that numbers the blocks L0, L1, ... No sympy here.

    An identity owner's per-spaces are batched over it (one statistic per head). A perm or signed_perm
    owner takes the piece IND where one of its per-spaces in the block has a non-trivial piece (the owner
    and those axes are one irreducible of the wreath product), else its own group's pieces."""
    spaces = bound.spaces
    rank = {s: i for i, s in enumerate(spaces)}
    groups: dict[tuple, list] = {}
    for param in bound.params:
        for block in param.blocks:
            atoms = block.atoms
            for pieces in block_pieces(bound, atoms):
                label = tuple(sorted(((atoms[k].space, p) for k, p in enumerate(pieces) if p in (STD, NAT, IND)),
                                     key=lambda sp: rank[sp[0]]))
                batch_spaces = tuple(sorted({spaces[s].per for s, _ in label
                                             if spaces[s].per and spaces[spaces[s].per].group == "identity"},
                                            key=rank.__getitem__))
                groups.setdefault((label, batch_spaces), []).append((param.name, block, pieces))
    return groups


def block_pieces(bound: BoundSpec, atoms: tuple) -> list[tuple[str | None, ...]]:
    """The components of one block: a piece for every atom (None for multiplicity atoms). An owner with a
    group (perm, signed_perm) whose per-spaces occur in the block is chosen after them: IND where one of
    them has a non-trivial piece, else the owner's own pieces."""
    spaces = bound.spaces
    owned = {k: [j for j, b in enumerate(atoms) if b.space is not None and spaces[b.space].per == a.space]
             for k, a in enumerate(atoms) if a.space is not None and spaces[a.space].group != "identity"}
    owned = {k: js for k, js in owned.items() if js}
    choices = [(None,) if k in owned else single_pieces(spaces[a.space].group if a.space else "identity", a.size)
               for k, a in enumerate(atoms)]
    out = []
    for base in itertools.product(*choices):
        if not owned:
            out.append(base)
            continue
        options = [(IND,) if any(base[j] in (STD, NAT) for j in js)
                   else single_pieces(spaces[atoms[k].space].group, atoms[k].size) for k, js in owned.items()]
        for chosen in itertools.product(*options):
            pieces = list(base)
            for k, p in zip(owned, chosen):
                pieces[k] = p
            out.append(tuple(pieces))
    return out


def derive_structure(bound: BoundSpec, *, ids: dict[tuple, str] | None = None, prefix: str = "L") -> Structure:
    """Enumerate components, group them by label, and write every size as an expression.

    Blocks are named f"{prefix}{i}" in order of appearance, or by `ids` ((label, batch spaces) ->
    id) where the caller numbers them over a larger spec (compiler.templates)."""
    spaces = bound.spaces
    n = {s: symbol(sp.symbol) for s, sp in spaces.items()}
    groups = label_groups(bound)

    blocks = []
    for i, ((label, batch_spaces), members) in enumerate(groups.items()):
        cols = tuple(s for s, _ in label)
        block_id = ids[(label, batch_spaces)] if ids is not None else f"{prefix}{i}"
        parts = []
        for pname, block, pieces in members:
            atoms = block.atoms
            size = [symbol(a.symbol) for a in atoms]
            kept = [k for k, p in enumerate(pieces) if p != TRIV]
            batch_pos = [next(k for k in kept if atoms[k].space == b) for b in batch_spaces]
            col_pos = [next(k for k in kept if atoms[k].space == s) for s in cols]
            mult_pos = [k for k in kept if k not in batch_pos and k not in col_pos]
            parts.append((pname, block, pieces, size, kept, batch_pos, col_pos, mult_pos,
                          sympy.Mul(*[size[k] for k in mult_pos])))
        offsets, mult, defs = running_offsets(block_id, [part[-1] for part in parts])
        comps = []
        for (pname, block, pieces, size, kept, batch_pos, col_pos, mult_pos, rows), offset in zip(parts, offsets):
            comps.append(Component(
                param=pname, block=block.index, pieces=pieces,
                order=tuple(kept.index(k) for k in batch_pos + mult_pos + col_pos),
                batch_shape=tuple(size[k] for k in batch_pos),
                mult_shape=tuple(size[k] for k in mult_pos),
                col_shape=tuple(size[k] for k in col_pos),
                row_offset=offset, rows=rows,
                triv_norm=1 / sympy.sqrt(sympy.Mul(*[size[k] for k, p in enumerate(pieces) if p == TRIV]))))
        blocks.append(IsotypicBlock(
            id=block_id, label=label, batch_spaces=batch_spaces, batch=sympy.Mul(*[n[b] for b in batch_spaces]),
            mult=mult, cols=cols, width=sympy.Mul(*[n[s] for s in cols]),
            dim=sympy.Mul(*[sympy.Add(n[s], -1, evaluate=False) if p == STD else n[s] for s, p in label]),
            components=tuple(comps), offset_defs=defs))
    return Structure(bound=bound, blocks=tuple(blocks))
