"""Stage 3 for spaces that repeat within one tensor: a space that occurs twice in one parameter block
(docs/repeated_spaces.md).

A parameter such as an RNN's W_hh (h x h), acted on as Q W Q^T, carries R^n (x) R^n, whose
irreducible pieces are not those of R^n. The commutant of the group on it is spanned by diagrams
(`compiler.diagrams`); its simple blocks are the isotypic pieces below. Each piece comes with an
equivariant coordinate map whose frame is shared with every other copy of the same irrep, in this
parameter, in other parameters, and in the pieces of R^n of compiler.structure, so that its formula

    S_g on lambda = (Y_lambda Y_lambda^T / d_lambda) (x) I

holds unchanged: Y stacks every copy of lambda, in its common frame. The pieces, for X in R^{n x n}:

  orthogonal  triv  tr(X)/sqrt(n)                        d = 1
              sym   (X + X^T)/2 - tr(X) I/n              d = n(n+1)/2 - 1   (frame n^2)
              alt   (X - X^T)/2                          d = n(n-1)/2       (frame n^2)
  signed_perm triv  tr(X)/sqrt(n)                        d = 1
              diag  (I - J/n) diag(X)                    d = n - 1          (frame n)
              sym   (X + X^T)/2 with its diagonal zeroed d = n(n-1)/2       (frame n^2)
              alt   (X - X^T)/2                          d = n(n-1)/2       (frame n^2)
  perm        with P = I - J/n and Xc = P X P:
              triv  1^T X 1 / n,   tr(Xc)/sqrt(n-1)      d = 1, two copies
              std   P X 1/sqrt(n),  P X^T 1/sqrt(n),  sqrt(n/(n-2)) P diag(Xc)
                                                         d = n - 1, three copies, frame as a single std's
              alt   (Xc - Xc^T)/2                        d = (n-1)(n-2)/2   (frame n^2)
              sym   the rest of (Xc + Xc^T)/2            d = n(n-3)/2       (frame n^2; absent for n = 3)

Dimensions and coefficients are sympy expressions in the size symbol. `copy_projectors` writes the
projector of every copy as a combination of diagrams with coefficients in Q(n); `piece_dims` takes
d_lambda from the traces of the central idempotents (`piece_projectors`), and `check_pieces`
verifies exactly, in the diagram algebra, that the copies are orthogonal idempotents summing to the
identity and that each irrep's idempotent is central: the decomposition into simple blocks. The maps are
orthogonal projections or isometries, so gather is an orthogonal change of coordinates and scatter
its transpose. Cost per parameter: a few passes over the tensor (sums, diagonals, transposes).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

import sympy
from sympy.polys.matrices import DomainMatrix

from .bound import BoundSpec
from .diagrams import N, Partition, diagrams, gram_matrix
from .structure import IND, NAT, STD, TRIV, IsotypicBlock, Structure, running_offsets, single_pieces, symbol

REPEATED_VERSION = "2"

# label piece ("irrep") per pair-piece, with its frame width as a power of n (1: vector, 2: matrix)
ALT, SYM, DIAG = "alt", "sym", "diag"


@dataclass(frozen=True)
class PairPiece:
    """One equivariant coordinate map on R^n (x) R^n: `name` is its helper in the generated code,
    `irrep` the label piece it lands in, `out_ndim` the number of frame axes (0: one coordinate)."""

    name: str
    irrep: str
    out_ndim: int
    coeffs: tuple[sympy.Expr, ...]


def pair_pieces(group: str, n: sympy.Expr, size: int) -> tuple[PairPiece, ...]:
    """The pieces of R^n (x) R^n under `group`, for a concrete `size` (which drops empty ones)."""
    if group == "orthogonal":
        return (PairPiece("tr", TRIV, 0, (1 / sympy.sqrt(n),)), PairPiece("osym", SYM, 2, (1 / n,)),
                PairPiece("alt", ALT, 2, ()))
    if group == "signed_perm":
        return (PairPiece("tr", TRIV, 0, (1 / sympy.sqrt(n),)), PairPiece("bdiag", DIAG, 1, ()),
                PairPiece("bsym", SYM, 2, ()), PairPiece("alt", ALT, 2, ()))
    if group == "perm":
        t2, dg = 1 / sympy.sqrt(n - 1), sympy.sqrt(n / (n - 2))
        out = [PairPiece("t1", TRIV, 0, (1 / n,)), PairPiece("t2", TRIV, 0, (t2,)),
               PairPiece("row", STD, 1, (1 / sympy.sqrt(n),)), PairPiece("col", STD, 1, (1 / sympy.sqrt(n),)),
               PairPiece("pdiag", STD, 1, (dg,)), PairPiece("palt", ALT, 2, ())]
        if size > 3:  # the (n-2, 2) irrep has dimension n(n-3)/2: empty for n = 3
            out.append(PairPiece("psym", SYM, 2, (t2, dg)))
        return tuple(out)
    raise ValueError(f"no pair pieces for group {group!r}")


def irrep_dim(group: str, irrep: str, n: sympy.Expr) -> sympy.Expr:
    """d_lambda of one space's piece (single-occurrence pieces and pair pieces alike)."""
    table = {
        ("perm", STD): n - 1, ("perm", ALT): (n - 1) * (n - 2) / 2, ("perm", SYM): n * (n - 3) / 2,
        ("signed_perm", NAT): n, ("signed_perm", DIAG): n - 1, ("signed_perm", SYM): n * (n - 1) / 2,
        ("signed_perm", ALT): n * (n - 1) / 2,
        ("orthogonal", NAT): n, ("orthogonal", SYM): n * (n + 1) / 2 - 1, ("orthogonal", ALT): n * (n - 1) / 2,
        ("perm", IND): n, ("signed_perm", IND): n,  # the owner's factor of an induced piece (structure.IND)
    }
    if irrep in (ALT, SYM, DIAG):
        # derived, not looked up: the trace of the piece's projector in the diagram algebra
        return sympy.expand(piece_dims(group)[irrep].subs(N, n))
    return sympy.expand(table[(group, irrep)])


def frame_width(irrep: str, n: sympy.Expr) -> sympy.Expr:
    return n ** 2 if irrep in (ALT, SYM) else n


# ---------------------------------------------------------------------------------- symbolic checks
# Operators on R^n (x) R^n written in the diagram basis of k = 4 points (0, 1: output indices,
# 2, 3: input indices). Their products follow the diagram algebra: compose, count closed loops.

@cache
def _compose(a: Partition, b: Partition) -> tuple[Partition, int]:
    """Product a b of two partitions on 4 points (top 0,1 / bottom 2,3): the diagram and the
    number of components that touch only the middle row (each contributes a factor n)."""
    # points: a's top 0,1 -> ('t',i); a's bottom = b's top -> ('m',i); b's bottom -> ('b',i)
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    def union(x, y):
        parent[find(x)] = find(y)

    def name(diagram: str, p: int):
        if diagram == "a":
            return ("t", p) if p < 2 else ("m", p - 2)
        return ("m", p) if p < 2 else ("b", p - 2)

    for d, part in (("a", a), ("b", b)):
        for block in part:
            for x in block:
                union(name(d, block[0]), name(d, x))
    nodes = [("t", 0), ("t", 1), ("m", 0), ("m", 1), ("b", 0), ("b", 1)]
    comps: dict = {}
    for x in nodes:
        comps.setdefault(find(x), []).append(x)
    loops = sum(1 for c in comps.values() if all(x[0] == "m" for x in c))
    index = {("t", 0): 0, ("t", 1): 1, ("b", 0): 2, ("b", 1): 3}
    blocks = [tuple(sorted(index[x] for x in c if x[0] != "m")) for c in comps.values()]
    return tuple(sorted(b for b in blocks if b)), loops


# exact arithmetic in the field Q(n): fast, and equality is exact (no simplification heuristics)
K = sympy.QQ.frac_field(N)
KN = K.from_sympy(N)


def _d(*blocks: tuple[int, ...]) -> Partition:
    return tuple(sorted(tuple(sorted(b)) for b in blocks))


def _lin(*terms: tuple[sympy.Expr, dict]) -> dict:
    """sum of coefficient * diagram combination."""
    out: dict = {}
    for c, x in terms:
        for k, v in x.items():
            out[k] = out.get(k, K.zero) + c * v
    return {k: v for k, v in out.items() if v != K.zero}


@cache
def copy_projectors(group: str) -> dict[str, tuple[dict[Partition, sympy.Expr], ...]]:
    """For each irrep of R^n (x) R^n, the projectors onto its copies (the maps of the module
    docstring) as combinations of diagram operators, coefficients rational in n.

    Points 0, 1 are the output indices (i, j), 2, 3 the input (k, l): {02}{13} is X -> X, {03}{12}
    X -> X^T, {01}{23} X -> tr(X) I, {0123} X -> diag(diag X); for perm, {02}{1}{3} is X -> X J and
    {0}{13}{2} X -> J X, {0}{1}{2}{3} X -> J X J."""
    one, half, n = K.one, K.one / 2, KN
    ident, swap = {_d((0, 2), (1, 3)): one}, {_d((0, 3), (1, 2)): one}
    trace, full = {_d((0, 1), (2, 3)): one}, {_d((0, 1, 2, 3)): one}
    sym, alt = _lin((half, ident), (half, swap)), _lin((half, ident), (-half, swap))
    if group == "orthogonal":
        return {TRIV: (_lin((1 / n, trace)),), SYM: (_lin((one, sym), (-1 / n, trace)),), ALT: (alt,)}
    if group == "signed_perm":
        return {TRIV: (_lin((1 / n, trace)),), DIAG: (_lin((one, full), (-1 / n, trace)),),
                SYM: (_lin((one, sym), (-one, full)),), ALT: (alt,)}
    if group == "perm":
        right, left = {_d((0, 2), (1,), (3,)): one}, {_d((0,), (1, 3), (2,)): one}
        both = {_d((0,), (1,), (2,), (3,)): one}
        dc = _lin((one, ident), (-1 / n, left), (-1 / n, right), (1 / n ** 2, both))  # X -> P X P
        t1 = _lin((1 / n ** 2, both))
        t2 = _lin((1 / (n - 1), _multiply(_multiply(dc, trace), dc)))
        row, col = _lin((1 / n, right), (-1 / n ** 2, both)), _lin((1 / n, left), (-1 / n ** 2, both))
        centred_diag = _lin((one, full), (-1 / n, trace))  # X -> diag((I - J/n) diag X)
        pdiag = _lin((n / (n - 2), _multiply(_multiply(dc, centred_diag), dc)))
        palt = _multiply(dc, alt)
        psym = _lin((one, _multiply(dc, sym)), (-one, t2), (-one, pdiag))
        return {TRIV: (t1, t2), STD: (row, col, pdiag), ALT: (palt,), SYM: (psym,)}
    raise ValueError(f"no diagram projectors for group {group!r}")


def piece_projectors(group: str) -> dict[str, dict[Partition, sympy.Expr]]:
    """The central idempotents of the commutant on R^n (x) R^n (one per irrep, the sum of its
    copies): the simple blocks that powers act on separately."""
    return {k: _lin(*((K.one, c) for c in copies)) for k, copies in copy_projectors(group).items()}


def _multiply(x: dict, y: dict) -> dict:
    out: dict = {}
    for (a, ca), (b, cb) in itertools.product(x.items(), y.items()):
        c, loops = _compose(a, b)
        out[c] = out.get(c, K.zero) + ca * cb * KN ** loops
    return {k: v for k, v in out.items() if v != K.zero}


def _root(parent: list[int], i: int) -> int:
    while parent[i] != i:
        i = parent[i]
    return i


def _trace(x: dict) -> sympy.Expr:
    """Trace of a diagram operator: join each output point with its input point (0-2, 1-3) and
    count the components, n^components per diagram."""
    total = K.zero
    for part, c in x.items():
        parent = list(range(4))
        for block in (*part, (0, 2), (1, 3)):
            for i in block:
                parent[_root(parent, i)] = _root(parent, block[0])
        total += c * KN ** len({_root(parent, i) for i in range(4)})
    return total


@cache
def check_pieces(group: str) -> dict[str, sympy.Expr]:
    """Verify symbolically (in n) that the copy projectors are orthogonal idempotents summing to the
    identity and that each irrep's sum is central (commutes with every diagram of the group); return
    the irrep dimensions d_lambda = trace / (number of copies)."""
    copies = [(k, i, c) for k, cs in copy_projectors(group).items() for i, c in enumerate(cs)]
    for (ka, ia, a), (kb, ib, b) in itertools.product(copies, repeat=2):
        _require_equal(_multiply(a, b), a if (ka, ia) == (kb, ib) else {}, f"{group}: {ka}{ia} * {kb}{ib}")
    total = _lin(*((K.one, c) for _, _, c in copies))
    _require_equal(total, {_d((0, 2), (1, 3)): K.one}, f"{group}: sum of the projectors")
    central = piece_projectors(group)
    for k, e in central.items():
        for pi in diagrams(group, 4):
            _require_equal(_multiply(e, {pi: K.one}), _multiply({pi: K.one}, e),
                           f"{group}: {k} is not central")
    return piece_dims(group)


@cache
def piece_dims(group: str) -> dict[str, sympy.Expr]:
    """d_lambda of each irrep of R^n (x) R^n: the trace of its central idempotent over its number of
    copies (what compiling needs; `check_pieces` also verifies the algebra, which takes longer)."""
    sizes = {k: len(cs) for k, cs in copy_projectors(group).items()}
    return {k: sympy.factor(K.to_sympy(_trace(e) / sizes[k])) for k, e in piece_projectors(group).items()}


def _require_equal(x: dict, y: dict, what: str) -> None:
    """Two diagram combinations are equal as rational functions of n (exact, in Q(n); sympy's
    simplify would also import sympy.physics and cost most of a cold compile)."""
    for k in set(x) | set(y):
        if x.get(k, K.zero) != y.get(k, K.zero):
            raise RuntimeError(f"repeated-space piece projectors are inconsistent ({what}, diagram {k})")


@cache
def gram_inverse(group: str, k: int = 4) -> sympy.Matrix:
    """The exact inverse of the diagram Gram matrix, rational in n: projection coefficients onto the
    commutant are c = G^{-1} b with b_pi = <delta_pi, v v^T> (needs n large enough that the diagrams
    are independent: n >= k for perm)."""
    # exact Gaussian elimination over the field Q(n), then factor each entry
    exact = DomainMatrix.from_Matrix(gram_matrix(group, k)).to_field().inv().to_Matrix()
    return exact.applyfunc(sympy.factor)


# ---------------------------------------------------------------------------------- which layouts

def has_repeated_spaces(bound: BoundSpec) -> bool:
    """Whether some space a group moves occurs twice in one block (the layouts this module compiles)."""
    return bool(bound.repeated_spaces)


def key_material(bound: BoundSpec) -> str:
    """Extra cache-key text for layouts with repeated spaces ('' for the others): the version, and the
    sizes that change which pieces exist (a repeated perm space of size 3)."""
    rep = bound.repeated_spaces
    if not rep:
        return ""
    flags = ";".join(f"{s}:{bound.spaces[s].group}:{'N3' if bound.spaces[s].size == 3 else ''}"
                     for s in sorted(rep))
    return f"|repeated v{REPEATED_VERSION}|{flags}"


# ---------------------------------------------------------------------------------- the structure

@dataclass(frozen=True)
class Slot:
    """One space of a block with its chosen piece: `atoms` are its one or two atom indices; `piece`
    is TRIV/STD/NAT for a single occurrence or a PairPiece for two."""

    space: str
    atoms: tuple[int, ...]
    piece: object
    irrep: str


@dataclass(frozen=True)
class RepeatedComponent:
    """One component of one block. The block's atoms are permuted by `canon` into
    (batch atoms, multiplicity atoms, slot atoms in slot order); slot maps act in that order."""

    param: str
    block: int
    slots: tuple[Slot, ...]
    canon: tuple[int, ...]
    batch_shape: tuple[sympy.Expr, ...]
    mult_shape: tuple[sympy.Expr, ...]
    slot_sizes: tuple[sympy.Expr, ...]  # the size symbol of each slot's space
    row_offset: sympy.Expr
    rows: sympy.Expr


def _induced(slots: tuple[Slot, ...], owned: dict[int, list[int]], options: list) -> tuple[Slot, ...] | None:
    """`slots` with every owner whose per-spaces include a non-trivial piece set to IND, or None for the
    duplicates that choice makes (the owner's other pieces, which IND replaces)."""
    out = list(slots)
    for i, js in owned.items():
        if any(slots[j].irrep != TRIV for j in js):
            if slots[i] != options[i][0]:
                return None
            out[i] = Slot(slots[i].space, slots[i].atoms, IND, IND)
    return tuple(out)


def derive_repeated(bound: BoundSpec) -> Structure:
    """Components of every block, grouped by label, with every size a sympy expression."""
    spaces = bound.spaces
    rank = {s: i for i, s in enumerate(spaces)}
    nsym = {s: symbol(sp.symbol) for s, sp in spaces.items()}
    groups: dict[tuple, list] = {}
    for param in bound.params:
        for block in param.blocks:
            atoms = block.atoms
            moved: dict[str, list[int]] = {}
            for k, a in enumerate(atoms):
                if a.space is not None and spaces[a.space].group != "identity":
                    moved.setdefault(a.space, []).append(k)
            order = sorted(moved, key=rank.__getitem__)
            options = []
            for s in order:
                sp = spaces[s]
                if len(moved[s]) == 1:
                    options.append([Slot(s, tuple(moved[s]), p, p) for p in single_pieces(sp.group, sp.size)])
                else:
                    options.append([Slot(s, tuple(moved[s]), p, p.irrep)
                                    for p in pair_pieces(sp.group, nsym[s], sp.size)])
            # a perm / signed_perm owner with its per-spaces in the block (each once: compiler.bind) takes the
            # induced piece where one of them is non-trivial, as in compiler.structure.block_pieces
            owned = {i: [j for j, t in enumerate(order) if spaces[t].per == s] for i, s in enumerate(order)}
            owned = {i: js for i, js in owned.items() if js}
            for slots in itertools.product(*options):
                if owned:
                    slots = _induced(slots, owned, options)
                    if slots is None:
                        continue
                label = tuple((sl.space, sl.irrep) for sl in slots if sl.irrep != TRIV)
                batch_spaces = tuple(sorted({spaces[s].per for s, _ in label
                                             if spaces[s].per and spaces[spaces[s].per].group == "identity"},
                                            key=rank.__getitem__))
                groups.setdefault((label, batch_spaces), []).append((param.name, block, slots))

    blocks = []
    for i, ((label, batch_spaces), members) in enumerate(groups.items()):
        block_id = f"L{i}"
        parts = []
        for pname, block, slots in members:
            atoms = block.atoms
            slot_atoms = [k for sl in slots for k in sl.atoms]
            batch_pos = [next(k for k, a in enumerate(atoms) if a.space == b) for b in batch_spaces]
            mult_pos = [k for k in range(len(atoms)) if k not in slot_atoms and k not in batch_pos]
            size = [symbol(a.symbol) for a in atoms]
            parts.append((pname, block, slots, slot_atoms, batch_pos, mult_pos, size,
                          sympy.Mul(*[size[k] for k in mult_pos])))
        offsets, mult, defs = running_offsets(block_id, [part[-1] for part in parts])
        comps = []
        for (pname, block, slots, slot_atoms, batch_pos, mult_pos, size, rows), offset in zip(parts, offsets):
            comps.append(RepeatedComponent(
                param=pname, block=block.index, slots=tuple(slots), canon=tuple(batch_pos + mult_pos + slot_atoms),
                batch_shape=tuple(size[k] for k in batch_pos), mult_shape=tuple(size[k] for k in mult_pos),
                slot_sizes=tuple(nsym[sl.space] for sl in slots), row_offset=offset, rows=rows))
        width = sympy.Mul(*[frame_width(p, nsym[s]) for s, p in label])
        dim = sympy.Mul(*[irrep_dim(spaces[s].group, p, nsym[s]) for s, p in label])
        blocks.append(IsotypicBlock(
            id=block_id, label=label, batch_spaces=batch_spaces, batch=sympy.Mul(*[nsym[b] for b in batch_spaces]),
            mult=mult, cols=tuple(s for s, _ in label), width=width, dim=dim, components=tuple(comps),
            offset_defs=defs))
    return Structure(bound=bound, blocks=tuple(blocks))
