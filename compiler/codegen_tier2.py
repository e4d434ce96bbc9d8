"""Stage 4 for tier 2: the structure of `compiler.tier2` -> the source of a small PyTorch module.

The module has the interface of tier 1's (`BLOCKS`, `gather`, `scatter`), so `CompiledSpec`,
`Curvature` and the optimizer use it unchanged. Each component permutes its block into
(batch, multiplicity, slot axes), applies the slot maps from the last slot to the first (so the
positions of earlier slots never move) and flattens into Y (batch, mult, width); scatter applies the
adjoint maps in the opposite order. The pair maps are a handful of torch helpers (sums, diagonals,
transposes, means) defined at the top of the module; their coefficients are sympy expressions printed
at the call sites.

User text (parameter names, size keys) appears only inside repr() literals: size symbols are bound
to generated names `_s0, _s1, ...`, and no comment quotes a spec.
"""

from __future__ import annotations

import sympy

from .codegen import GeneratedCode
from .structure import NAT, STD, TRIV, Structure, pycode, symbol
from .tier2 import TIER2_VERSION, PairPiece

HELPERS = '''
def _std(x, dim):
    # the standard piece of a perm space: (I - J/n) x along one axis
    return x - x.mean(dim=dim, keepdim=True)


def _end(x, p):
    return x.movedim((p, p + 1), (-2, -1))


def _back2(y, p):
    return y.movedim((-2, -1), (p, p + 1))


def _eye(n, like):
    return torch.eye(n, dtype=like.dtype, device=like.device)


def _sym(m):
    return (m + m.transpose(-1, -2)) / 2


def _skew(m):
    return (m - m.transpose(-1, -2)) / 2


def _dc(m):
    # double centering P m P, P = I - J/n
    return _std(_std(m, -1), -2)


def _trace(m):
    return m.diagonal(0, -2, -1).sum(-1)


def _scalar_t(t, p, mat):
    # a coordinate per multiplicity index -> that coordinate times a fixed n x n matrix
    return _back2(t.unsqueeze(-1).unsqueeze(-1) * mat, p)


def _vec_t(z, p):
    return z.movedim(p, -1)


# ---- gather: pair at axes (p, p+1) -> its coordinates; scatter: the adjoint
def _g_tr(x, p, n, c):
    return _trace(_end(x, p)) * c


def _s_tr(t, p, n, c):
    return _scalar_t(t, p, _eye(n, t) * c)


def _g_alt(x, p, n):
    return _back2(_skew(_end(x, p)), p)


_s_alt = _g_alt


def _g_osym(x, p, n, c):
    m = _sym(_end(x, p))
    return _back2(m - (_trace(m) * c).unsqueeze(-1).unsqueeze(-1) * _eye(n, m), p)


_s_osym = _g_osym


def _g_bdiag(x, p, n):
    return _std(_end(x, p).diagonal(0, -2, -1), -1).movedim(-1, p)


def _s_bdiag(z, p, n):
    return _back2(torch.diag_embed(_std(_vec_t(z, p), -1)), p)


def _g_bsym(x, p, n):
    m = _sym(_end(x, p))
    return _back2(m - torch.diag_embed(m.diagonal(0, -2, -1)), p)


_s_bsym = _g_bsym


def _g_t1(x, p, n, c):
    return _end(x, p).sum((-2, -1)) * c


def _s_t1(t, p, n, c):
    return _scalar_t(t, p, torch.full((n, n), 1.0, dtype=t.dtype, device=t.device) * c)


def _g_row(x, p, n, c):
    return (_std(_end(x, p).sum(-1), -1) * c).movedim(-1, p)


def _s_row(z, p, n, c):
    v = _std(_vec_t(z, p), -1) * c
    return _back2(v.unsqueeze(-1).expand(*v.shape, n), p)


def _g_col(x, p, n, c):
    return (_std(_end(x, p).sum(-2), -1) * c).movedim(-1, p)


def _s_col(z, p, n, c):
    v = _std(_vec_t(z, p), -1) * c
    return _back2(v.unsqueeze(-2).expand(*v.shape[:-1], n, n), p)


def _g_t2(x, p, n, c):
    return _trace(_dc(_end(x, p))) * c


def _s_t2(t, p, n, c):
    return _scalar_t(t, p, _dc(_eye(n, t)) * c)


def _pdiag(m, c):
    return _std(_dc(m).diagonal(0, -2, -1), -1) * c


def _pdiag_t(v, c):
    return _dc(torch.diag_embed(_std(v, -1) * c))


def _g_pdiag(x, p, n, c):
    return _pdiag(_end(x, p), c).movedim(-1, p)


def _s_pdiag(z, p, n, c):
    return _back2(_pdiag_t(_vec_t(z, p), c), p)


def _g_palt(x, p, n):
    return _back2(_skew(_dc(_end(x, p))), p)


_s_palt = _g_palt


def _g_psym(x, p, n, c2, cd):
    # sym part of P X P minus its invariant (t2) and standard (pdiag) parts: the (n-2, 2) irrep
    m = _sym(_dc(_end(x, p)))
    inv = (_trace(m) * c2 * c2).unsqueeze(-1).unsqueeze(-1) * _dc(_eye(n, m))
    return _back2(m - inv - _pdiag_t(_pdiag(m, cd), cd), p)


_s_psym = _g_psym
'''


class _Printer:
    """Prints sympy expressions with the size symbols renamed to generated identifiers."""

    def __init__(self, names: list[str]) -> None:
        self.names = {name: f"_s{i}" for i, name in enumerate(sorted(names))}
        self.subs = {symbol(name): ident for name, ident in self.names.items()}

    def __call__(self, expr) -> str:
        return pycode(expr, self.subs)

    def shape(self, exprs) -> str:
        items = [self(e) for e in exprs]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


class _Code(str):
    def __repr__(self) -> str:
        return str(self)


def generate_tier2(structure: Structure, key: str) -> GeneratedCode:
    bound = structure.bound
    sizes = bound.sizes
    pr = _Printer(list(sizes))
    comps_by_block: dict[tuple[str, int], list] = {}
    for ib in structure.blocks:
        for c in ib.components:
            comps_by_block.setdefault((c.param, c.block), []).append((ib, c))

    lines = [
        f"# Generated by symo's compiler (tier 2 v{TIER2_VERSION}): do not edit.",
        f"# Key: {key}. Sizes are read from N when the module is loaded, so this code serves every width.",
        "# gather(): tensors -> Y per isotypic block, through the pair maps below; scatter(): its transpose.",
        "import math  # noqa: F401",
        "",
        "import torch",
        "",
    ]
    for name in sorted(sizes):
        lines.append(f"{pr.names[name]} = N[{name!r}]")
    for ib in structure.blocks:  # running row offsets of blocks with several components
        for sym, previous, rows in ib.offset_defs:
            lines.append(f"{sym} = {pr(previous)} + {pr(rows)}")
    lines += HELPERS.splitlines()
    lines += ["", "BLOCKS = ["]
    for ib in structure.blocks:
        meta = {
            "id": ib.id, "name": ib.name, "label": [list(x) for x in ib.label],
            "batch_spaces": list(ib.batch_spaces), "batch": _Code(pr(ib.batch)), "mult": _Code(pr(ib.mult)),
            "width": _Code(pr(ib.width)), "dim": _Code(f"int({pr(ib.dim)})"), "dim_expr": str(ib.dim),
            "rows": [[c.param, c.block, "".join(_tag(sl) for sl in c.slots), _Code(pr(c.row_offset)),
                      _Code(pr(c.rows))] for c in ib.components],
        }
        lines.append(f"    {meta!r},")
    lines += ["]", "", ""]

    lines += ["def gather(t):", '    """{param: tensor} -> {block id: Y (batch, mult, width)}."""']
    ys: dict[str, list[str]] = {ib.id: [] for ib in structure.blocks}
    for pi, p in enumerate(bound.params):
        segments = _segments(p)
        for b in p.blocks:
            var = f"b{pi}_{b.index}"
            expr = f"t[{p.name!r}]"
            for a in p.fused_axes:
                start, length = segments[a][b.slices[a][0]]
                expr += f".narrow({a}, {pr(start)}, {pr(length)})"
            if any(len(axis) > 1 for axis in b.axes):
                expr += f".reshape({pr.shape(symbol(at.symbol) for at in b.atoms)})"
            lines.append(f"    {var} = {expr}")
            for ib, c in comps_by_block[(p.name, b.index)]:
                y = f"y_{ib.id}_{len(ys[ib.id])}"
                lines.append(f"    {y} = {_gather_expr(var, c, ib, pr)}")
                ys[ib.id].append(y)
    lines.append("    return {")
    for ib in structure.blocks:
        parts = ys[ib.id]
        joined = parts[0] if len(parts) == 1 else f"torch.cat([{', '.join(parts)}], dim=1)"
        lines.append(f"        {ib.id!r}: {joined},")
    lines += ["    }", "", ""]

    lines += ["def scatter(z):",
              '    """{block id: Z (batch, mult, width)} -> {param: tensor}; gather\'s transpose."""']
    for ib in structure.blocks:
        lines.append(f"    z_{ib.id} = z[{ib.id!r}]")
    lines.append("    out = {}")
    for pi, p in enumerate(bound.params):
        segments = _segments(p)
        for b in p.blocks:
            var = f"b{pi}_{b.index}"
            terms = [_scatter_expr(f"z_{ib.id}", c, pr) for ib, c in comps_by_block[(p.name, b.index)]]
            atomic = pr.shape(symbol(a.symbol) for a in b.atoms)
            block_shape = pr.shape(segments[a][b.slices[a][0]][1] for a in range(len(b.axes)))
            expr = " + ".join(f"({t})" for t in terms) if len(terms) > 1 else terms[0]
            lines.append(f"    {var} = ({expr}).expand({atomic}).reshape({block_shape})")
        lines.append(f"    out[{p.name!r}] = {_assemble(p, pi)}")
    lines += ["    return out", ""]
    return GeneratedCode(key=key, source="\n".join(lines))


def _tag(slot) -> str:
    return slot.piece.name if isinstance(slot.piece, PairPiece) else (slot.piece or "_")[0]


def _base(c) -> int:
    return len(c.batch_shape) + len(c.mult_shape)


def _gather_expr(var: str, c, ib, pr: _Printer) -> str:
    expr = var
    if list(c.canon) != sorted(c.canon):
        expr = f"{expr}.permute{tuple(c.canon)!r}"
    positions = _positions(c)
    for slot, pos, n in reversed(list(zip(c.slots, positions, c.slot_sizes))):
        piece = slot.piece
        if isinstance(piece, PairPiece):
            args = ", ".join([pr(n)] + [pr(k) for k in piece.coeffs])
            expr = f"_g_{piece.name}({expr}, {pos}, {args})"
        elif piece == TRIV:
            expr = f"({expr}.sum(dim={pos}) * ({pr(1 / sympy.sqrt(n))}))"
        elif piece == STD:
            expr = f"_std({expr}, {pos})"
        elif piece != NAT:
            raise AssertionError(piece)
    return f"{expr}.reshape({pr.shape((ib.batch, c.rows, ib.width))})"


def _positions(c) -> list[int]:
    """Axis position of each slot, with every earlier slot still at its input arity."""
    out, pos = [], _base(c)
    for slot in c.slots:
        out.append(pos)
        pos += len(slot.atoms)
    return out


def _scatter_expr(zvar: str, c, pr: _Printer) -> str:
    expr = f"{zvar}[:, {pr(c.row_offset)}:{pr(c.row_offset)} + {pr(c.rows)}]"
    outs = []
    for slot, n in zip(c.slots, c.slot_sizes):
        piece = slot.piece
        if isinstance(piece, PairPiece):
            outs += [n] * piece.out_ndim
        elif piece in (STD, NAT):
            outs.append(n)
    expr += f".reshape({pr.shape(c.batch_shape + c.mult_shape + tuple(outs))})"
    for slot, pos, n in zip(c.slots, _positions(c), c.slot_sizes):
        piece = slot.piece
        if isinstance(piece, PairPiece):
            args = ", ".join([pr(n)] + [pr(k) for k in piece.coeffs])
            expr = f"_s_{piece.name}({expr}, {pos}, {args})"
        elif piece == TRIV:
            expr = f"({expr} * ({pr(1 / sympy.sqrt(n))})).unsqueeze({pos})"
        elif piece == STD:
            expr = f"_std({expr}, {pos})"
    inverse = tuple(sorted(range(len(c.canon)), key=lambda i: c.canon[i]))
    if list(inverse) != sorted(inverse):
        expr = f"({expr}).permute{inverse!r}"
    return expr


def _segments(p) -> list[dict[int, tuple[sympy.Expr, sympy.Expr]]]:
    out = []
    for a in range(len(p.shape)):
        seen = sorted({(b.slices[a][0], b.axes[a]) for b in p.blocks}, key=lambda x: x[0])
        table, start = {}, sympy.Integer(0)
        for concrete, atoms in seen:
            length = sympy.Mul(*[symbol(at.symbol) for at in atoms])
            table[concrete] = (start, length)
            start = length if start == 0 else sympy.Add(start, length, evaluate=False)
        out.append(table)
    return out


def _assemble(p, pi: int) -> str:
    counts = [len({b.slices[a][0] for b in p.blocks}) for a in range(len(p.shape))]
    flat = [f"b{pi}_{b.index}" for b in p.blocks]

    def build(axis: int, part: list[str]) -> str:
        if axis == len(counts):
            return part[0]
        step = len(part) // counts[axis]
        pieces = [build(axis + 1, part[i * step:(i + 1) * step]) for i in range(counts[axis])]
        return pieces[0] if len(pieces) == 1 else f"torch.cat([{', '.join(pieces)}], dim={axis})"

    return build(0, flat)
