"""What each element-wise torch operation does to axes and groups: unary and binary operations, losses and
reductions, the handlers behind `symo.infer.trace.Tracer` (shape operations: symo/infer/ops_shape.py; layers:
symo/infer/ops_nn.py).

A handler gets the operation's arguments and its real output, unifies, refines, pins or caps the atoms
of the tensors involved, and records the output's atoms and parity. Raising NotImplementedError makes
the operation "unsupported": its axes are left free and it is reported by name.
"""

from __future__ import annotations

import torch

from .trace import (
    BINARY,
    CONST,
    EVEN,
    EVEN_FN,
    IDENTITY,
    INV,
    LIN,
    LOSSES,
    NONE,
    ODD,
    ODD_FN,
    OTHER_FN,
    REDUCE,
    SQ,
    STATIC_OUT,
    Handler,
    Tracer,
    _arg,
    _tensors,
)


def _identity(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(x.shape):
        raise NotImplementedError
    r = tr.rec(x)
    tr._set(out, r.atoms, r.parity, r.data, r.why)


def _static_out(tr: Tracer, name, args, kwargs, out):
    return  # a fresh tensor of the same shape: fixed, no record


def _loss(tr: Tracer, name, args, kwargs, out):
    for t in _tensors((args, kwargs)):
        r = tr.rec(t)
        if r is not None:
            for a in r.atoms:
                tr.g.pin(a)
    tr._set(out, [tr.g.new(s, pinned=True) for s in out.shape], INV)


def _unary_parity(fn: str, p: str, exponent=None) -> str:
    if p in (CONST, INV):
        return p
    if fn in ODD_FN or (exponent is not None and float(exponent).is_integer() and int(exponent) % 2 == 1):
        return {LIN: ODD, ODD: ODD, EVEN: EVEN, SQ: EVEN}.get(p, NONE)
    if fn == "square" or (exponent is not None and exponent == 2):
        return SQ if p in (LIN, ODD) else (EVEN if p in (EVEN, SQ) else NONE)
    if fn in EVEN_FN or (exponent is not None and float(exponent).is_integer() and int(exponent) % 2 == 0):
        return EVEN if p != NONE else NONE
    return EVEN if p in (EVEN, SQ) else NONE


def _unary(tr: Tracer, name, args, kwargs, out):
    x = args[0] if args else kwargs.get("input")
    r = tr.rec(x)
    if r is None or tuple(out.shape) != tuple(x.shape):
        raise NotImplementedError
    parity = _unary_parity(name, r.parity)
    tr._set(out, r.atoms, parity, r.data)
    if parity == NONE:
        tr.recs[id(out)].why = r.why or name


def _align(tr: Tracer, operands, out, name) -> list[int]:
    """Broadcast operands against the output; unify their atoms axis by axis (from the right)."""
    atoms = []
    for d in range(out.dim()):
        k = out.dim() - 1 - d
        found = []
        for t in operands:
            if isinstance(t, torch.Tensor) and t.dim() > d and t.shape[t.dim() - 1 - d] > 1:
                r = tr.rec(t)
                a = r.atoms[t.dim() - 1 - d] if r is not None else tr.g.new(t.shape[t.dim() - 1 - d], pinned=True)
                found.append((a, r is None))
        if not found:
            atoms.append(tr.g.new(out.shape[k]))
            continue
        first = found[0][0]
        for a, fixed in found[1:]:
            breaking = None
            if fixed or found[0][1]:
                breaking = (f"{name}: a fixed tensor (not a parameter) varies along this axis "
                            "(e.g. rotary cos/sin, a buffer)")
            tr.g.unify(first, a, breaking)
        atoms.append(first)
    return atoms[::-1]


def _binary(tr: Tracer, name, args, kwargs, out):
    if name in ("where",):
        cond, a, b = args[0], _arg(args, kwargs, 1, "input"), _arg(args, kwargs, 2, "other")
        operands = [cond, a, b]
    elif name == "masked_fill":
        a, mask, b = args[0], _arg(args, kwargs, 1, "mask"), _arg(args, kwargs, 2, "value")
        operands = [a, mask, b]
    else:
        a, b = args[0], _arg(args, kwargs, 1, "other", kwargs.get("exponent"))
        operands = [a, b]
    if not isinstance(out, torch.Tensor):
        raise NotImplementedError
    before = _residual_roots(tr, a, b, out) if name in ("add", "sub", "__add__", "__radd__", "__iadd__",
                                                          "__sub__", "__rsub__", "__isub__") else []
    atoms = _align(tr, operands, out, name)
    for k in before:  # two parameter-dependent streams summed: a residual connection
        tr.g.role(atoms[k], "res")
    pa, pb = tr.parity(a), tr.parity(b)
    base = name.strip("_").removeprefix("r").removeprefix("i") if name.startswith("__") else name
    base = {"subtract": "sub", "multiply": "mul", "divide": "div", "true_divide": "div", "truediv": "div",
            "rsub": "sub", "float_power": "pow"}.get(base, base)
    rev = name in ("__rsub__", "__rtruediv__", "__rdiv__", "rsub")
    if base == "pow":
        parity = _unary_parity("pow", pa, b if isinstance(b, (int, float)) else None) if pb == CONST else NONE
    elif base in ("add", "sub"):
        parity = _add_parity(pa, pb, a, b, out, name, kwargs)
    elif base == "mul":
        parity = _mul_parity(pa, pb, a is b)
    elif base == "div":
        if rev:
            parity = pb if pb in (CONST, INV) and pa in (CONST, INV) else (INV if pb == INV else NONE)
        else:
            parity = pa if pb in (CONST, INV) else NONE
    else:  # where, masked_fill, maximum, ...
        parity = NONE
        if base in ("where", "masked_fill"):
            ps = {tr.parity(t) for t in operands if isinstance(t, torch.Tensor) and tr.rec(t) is not None}
            parity = INV if ps <= {CONST, INV} else NONE
    if parity == CONST:
        parity = INV
    data = all(tr.rec(t) is None or tr.rec(t).data for t in operands if isinstance(t, torch.Tensor))
    tr._set(out, atoms, parity, data)
    if parity == NONE:
        prior = [r.why for t in operands if (r := tr.rec(t)) is not None and r.why]
        tr.recs[id(out)].why = prior[0] if prior else {
            "add": "x + c, a constant offset (as in tanh-GELU's 1 + tanh(...))", "sub": "x - c, a constant offset",
            "mul": "a product of hidden values"}.get(base, name)


def _residual_roots(tr: Tracer, a, b, out) -> list[int]:
    """Output axes where a and b (both parameter-dependent, unbroadcast) carry different free atoms."""
    ra, rb = tr.rec(a), tr.rec(b)
    if ra is None or rb is None or ra.data or rb.data or a.shape != out.shape or b.shape != out.shape:
        return []
    return [k for k, (x, y) in enumerate(zip(ra.atoms, rb.atoms))
            if tr.g.find(x) != tr.g.find(y) and not tr.g.is_pinned(x) and not tr.g.is_pinned(y)]


def _add_parity(pa, pb, a, b, out, name, kwargs) -> str:
    const = (CONST, INV)
    if pa in const and pb in const:
        return INV
    if pb in const or pa in const:
        moving, c = (pa, b) if pb in const else (pb, a)
        if isinstance(c, (int, float)) and c == 0:
            return moving
        return {LIN: NONE, ODD: NONE, EVEN: EVEN, SQ: EVEN}.get(moving, NONE)
    pair = {pa, pb}
    if pair <= {LIN}:
        return LIN
    if pair <= {LIN, ODD}:
        return ODD
    if pair == {SQ}:
        return SQ
    if pair <= {EVEN, SQ}:
        return EVEN
    return NONE


def _mul_parity(pa, pb, same: bool) -> str:
    const = (CONST, INV)
    if pa in const and pb in const:
        return INV
    if pa in const:
        return pb
    if pb in const:
        return pa
    if same and pa in (LIN, ODD):
        return SQ
    odd, even = {LIN, ODD}, {EVEN, SQ}
    if pa in odd and pb in odd:
        return EVEN
    if (pa in odd and pb in even) or (pa in even and pb in odd):
        return ODD
    if pa in even and pb in even:
        return EVEN
    return NONE


def _reduce(tr: Tracer, name, args, kwargs, out):
    if name in ("max", "min") and len(args) > 1 and isinstance(args[1], torch.Tensor):
        return _binary(tr, "maximum", args, kwargs, out)  # torch.max(a, b): element-wise
    x = args[0] if args else kwargs["input"]
    r = tr.rec(x)
    res = out[0] if isinstance(out, (tuple, list)) else out
    if r is None or not isinstance(res, torch.Tensor):
        raise NotImplementedError
    dim = _arg(args, kwargs, 1, "dim")
    if name in ("norm", "vector_norm", "linalg_vector_norm"):
        dim = kwargs.get("dim", args[2] if len(args) > 2 else None)
        if len(args) > 1 and not isinstance(args[1], (int, float)) and args[1] is not None:
            dim = args[1]
    if dim is None:
        dims = list(range(x.dim()))
    else:
        dims = [d % x.dim() for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
    reduced = [r.atoms[d] for d in dims if x.shape[d] > 1]
    spaces = [a for a in reduced if not tr.g.is_pinned(a)]
    parity = r.parity
    if spaces:
        p = r.parity
        if name in ("norm", "vector_norm", "linalg_vector_norm"):
            p = SQ if p in (LIN,) else p
        if name in ("amax", "amin", "max", "min", "var", "std", "logsumexp", "prod", "var_mean", "std_mean"):
            p = NONE if p not in (INV, CONST) else p
        if p == SQ:
            pass  # |x|^2 is O(n)-invariant
        elif p == EVEN:
            for a in spaces:
                tr.g.cap(a, "signed_perm", f"{name} of an even function over the axis")
        elif p not in (INV, CONST):
            for a in spaces:
                tr.g.cap(a, "perm", f"{name} over the axis (only permutations keep a sum of coordinates)")
        parity = INV
    keep = [i for i in range(x.dim()) if i not in dims]
    keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 and isinstance(args[2], bool) else False)
    if res.dim() == x.dim():  # keepdim
        atoms = [r.atoms[i] if i in keep else tr.g.new(1) for i in range(x.dim())]
    elif res.dim() == len(keep) and not keepdim:
        atoms = [r.atoms[i] for i in keep]
    else:
        raise NotImplementedError
    for t in (out if isinstance(out, (tuple, list)) else [out]):
        if isinstance(t, torch.Tensor) and t.dim() == len(atoms):
            tr._set(t, atoms, parity, r.data)

# ---------------------------------------------------------------- the table
# operation name (`op_name`) -> handler; a name in two sets keeps the later entry. symo/infer/handlers.py
# joins this table with ops_shape's and ops_nn's for the tracer.
HANDLERS: dict[str, Handler] = {
    **dict.fromkeys(IDENTITY, _identity),
    **dict.fromkeys(STATIC_OUT, _static_out),
    **dict.fromkeys(LOSSES, _loss),
    **dict.fromkeys(ODD_FN | EVEN_FN | OTHER_FN, _unary),
    **dict.fromkeys(BINARY, _binary),
    **dict.fromkeys(REDUCE, _reduce),
}
