"""Stage 4 for spaces that repeat within one tensor: the structure of `compiler.repeated` -> the
source of a small PyTorch module.

The module has the interface of compiler.codegen's (`BLOCKS`, `gather`, `scatter`) and is written
by the same emitter (compiler.emit), so `CompiledSpec`, `Curvature` and the optimizer use it
unchanged. What differs is how a component maps its block to rows (`PairMaps`): it permutes the
block into (batch, multiplicity, slot axes), applies the slot maps from the last slot to the first
(so the positions of earlier slots never move) and flattens into Y (batch, mult, width); scatter
applies the adjoint maps in the opposite order. The pair maps are a handful of torch helpers (sums,
diagonals, transposes, means) defined at the top of the module (the emitter keeps those the code
calls); their coefficients are sympy expressions printed at the call sites.
"""

from __future__ import annotations

import sympy

from .emit import STD_HELPER, GeneratedCode, code, from_rows, per_parameter_module, to_rows
from .repeated import PairPiece, RepeatedComponent
from .structure import IND, NAT, STD, TRIV, IsotypicBlock, Structure

HELPERS = '''
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


class PairMaps:
    """Slot maps: a single occurrence takes one piece (as in compiler.codegen), a repeated space a
    pair map (`_g_<piece>` in gather, its adjoint `_s_<piece>` in scatter)."""

    def tag(self, c: RepeatedComponent) -> str:
        return "".join(sl.piece.name if isinstance(sl.piece, PairPiece) else (sl.piece or "_")[0] for sl in c.slots)

    def gather(self, var: str, c: RepeatedComponent, ib: IsotypicBlock) -> str:
        expr = var
        if list(c.canon) != sorted(c.canon):
            expr = f"{expr}.permute{tuple(c.canon)!r}"
        for slot, pos, n in reversed(list(zip(c.slots, _positions(c), c.slot_sizes))):
            piece = slot.piece
            if isinstance(piece, PairPiece):
                expr = f"_g_{piece.name}({expr}, {pos}, {', '.join([code(n)] + [code(k) for k in piece.coeffs])})"
            elif piece == TRIV:
                expr = f"({expr}.sum(dim={pos}) * ({code(1 / sympy.sqrt(n))}))"
            elif piece == STD:
                expr = f"_std({expr}, {pos})"
            elif piece not in (NAT, IND):
                raise AssertionError(piece)
        return to_rows(expr, (c.batch_shape, c.mult_shape, _frame_axes(c)), (ib.batch, c.rows, ib.width))

    def scatter(self, rows: str, c: RepeatedComponent) -> tuple[str, bool]:
        expr = from_rows(rows, (c.batch_shape, c.mult_shape, _frame_axes(c)))
        full = True
        for slot, pos, n in zip(c.slots, _positions(c), c.slot_sizes):
            piece = slot.piece
            if isinstance(piece, PairPiece):
                expr = f"_s_{piece.name}({expr}, {pos}, {', '.join([code(n)] + [code(k) for k in piece.coeffs])})"
            elif piece == TRIV:
                expr = f"({expr} * ({code(1 / sympy.sqrt(n))})).unsqueeze({pos})"
                full = False
            elif piece == STD:
                expr = f"_std({expr}, {pos})"
        inverse = tuple(sorted(range(len(c.canon)), key=lambda i: c.canon[i]))
        if list(inverse) != sorted(inverse):
            expr = f"{expr}.permute{inverse!r}"
        return expr, full


PAIRS = PairMaps()


def generate_repeated(structure: Structure, key: str) -> GeneratedCode:
    return GeneratedCode(key=key, source=per_parameter_module(structure, key, "repeated spaces", PAIRS,
                                                              [STD_HELPER, HELPERS]))


def _frame_axes(c: RepeatedComponent) -> tuple:
    """The sizes of the component's frame axes after the slot maps (a trivial slot leaves none)."""
    outs = []
    for slot, n in zip(c.slots, c.slot_sizes):
        if isinstance(slot.piece, PairPiece):
            outs += [n] * slot.piece.out_ndim
        elif slot.piece in (STD, NAT, IND):
            outs.append(n)
    return tuple(outs)


def _positions(c: RepeatedComponent) -> list[int]:
    """Axis position of each slot, with every earlier slot still at its input arity."""
    out, pos = [], len(c.batch_shape) + len(c.mult_shape)
    for slot in c.slots:
        out.append(pos)
        pos += len(slot.atoms)
    return out
