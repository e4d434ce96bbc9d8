"""What shape operations do to axes and groups: reshape, transposes and permutations, expand and repeat, split,
concatenation and indexing (the element-wise handlers and the conventions are in symo/infer/ops.py).

A handler gets the operation's arguments and its real output, unifies, refines, pins or caps the atoms
of the tensors involved, and records the output's atoms and parity. Raising NotImplementedError makes
the operation "unsupported": its axes are left free and it is reported by name.
"""

from __future__ import annotations

import torch

from .trace import NONE, RESHAPE, Handler, Tracer, _arg


def _reshape(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    r = tr.rec(x)
    atoms = tr.g.reshape(r.atoms, list(out.shape))
    if atoms is None:
        for a in r.atoms:
            tr.g.pin(a, f"{name} from {tuple(x.shape)} to {tuple(out.shape)} regroups the axis in a way not understood")
        atoms = [tr.g.new(s, pinned=True) for s in out.shape]
    tr._set(out, atoms, r.parity, r.data, r.why)


def _dims(x, args):
    dims = args[1:] if len(args) > 2 or (len(args) == 2 and isinstance(args[1], int)) else args[1]
    return [d % x.dim() for d in dims]


def _permute(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    r = tr.rec(x)
    n = x.dim()
    order = list(range(n))
    if name in ("transpose", "swapaxes", "swapdims"):
        d0, d1 = _arg(args, kwargs, 1, "dim0") % n, _arg(args, kwargs, 2, "dim1") % n
        order[d0], order[d1] = order[d1], order[d0]
    elif name in ("t", "T", "H"):
        order = order[::-1]
    elif name in ("mT", "mH", "adjoint"):
        order[-1], order[-2] = order[-2], order[-1]
    elif name == "permute":
        order = _dims(x, args) if len(args) > 1 else [d % n for d in kwargs["dims"]]
    else:
        src, dst = _arg(args, kwargs, 1, "source"), _arg(args, kwargs, 2, "destination")
        src = [s % n for s in (src if isinstance(src, (list, tuple)) else [src])]
        dst = [d % n for d in (dst if isinstance(dst, (list, tuple)) else [dst])]
        rest = [d for d in range(n) if d not in src]
        order = [None] * n
        for s, d in zip(src, dst):
            order[d] = s
        it = iter(rest)
        order = [o if o is not None else next(it) for o in order]
    tr._set(out, [r.atoms[i] for i in order], r.parity, r.data, r.why)


def _expand(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    r = tr.rec(x)
    lead = out.dim() - x.dim()
    atoms = []
    for k in range(out.dim()):
        i = k - lead
        if i >= 0 and x.shape[i] == out.shape[k]:
            atoms.append(r.atoms[i])
        elif i >= 0 and x.shape[i] > 1:  # tiling a real axis copies coordinates
            tr.g.pin(r.atoms[i], f"{name} tiles the axis")
            atoms.append(tr.g.new(out.shape[k], pinned=True))
        else:
            atoms.append(tr.g.new(out.shape[k], pinned=True))
    tr._set(out, atoms, r.parity, r.data, r.why)


def _split(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    r = tr.rec(x)
    if name == "unbind":
        d = _arg(args, kwargs, 1, "dim", 0) % x.dim()
        if not tr.g.is_pinned(r.atoms[d]):
            tr.g.pin(r.atoms[d], "unbind selects single coordinates of the axis")
        for t in out:
            tr._set(t, [a for i, a in enumerate(r.atoms) if i != d], r.parity, r.data)
        return
    d = _arg(args, kwargs, 2, "dim", 0) % x.dim()
    pieces = tr.g.split_fused(r.atoms[d], [t.shape[d] for t in out])
    if pieces is None:
        tr.g.pin(r.atoms[d], f"{name} cuts the axis where an earlier operation split it differently")
        pieces = [tr.g.new(t.shape[d], pinned=True) for t in out]
    for t, p in zip(out, pieces):
        atoms = list(r.atoms)
        atoms[d] = p
        tr._set(t, atoms, r.parity, r.data, r.why)


def _cat(tr: Tracer, name, args, kwargs, out):
    tensors = list(args[0] if args else kwargs["tensors"])
    d = _arg(args, kwargs, 1, "dim", 0)
    if name in ("hstack", "vstack"):  # cat along the columns (rows for 1-D) / along new rows for 1-D tensors
        one_d = tensors[0].dim() == 1
        name, d = ("cat", 0 if one_d else 1) if name == "hstack" else (("stack", 0) if one_d else ("cat", 0))
    if name != "stack":
        # torch.cat skips a legacy empty 1-D tensor (shape (0,)) whatever the other shapes are: a key/value
        # cache starts as one (Hugging Face's DynamicCache) before the first step's keys are appended
        tensors = [t for t in tensors if not (t.dim() == 1 and t.numel() == 0 and out.dim() != 1)]
        if not tensors:
            raise NotImplementedError
    recs = [tr.atoms(t) for t in tensors]
    parities = {tr.parity(t) for t in tensors}
    parity = parities.pop() if len(parities) == 1 else NONE
    data = all(tr.rec(t) is None or tr.rec(t).data for t in tensors)
    if name == "stack":
        d = d % out.dim()
        for k in range(tensors[0].dim()):
            for atoms in recs[1:]:
                tr.g.unify(recs[0][k], atoms[k], f"{name}: a fixed tensor is stacked with a hidden one")
        atoms = list(recs[0])
        atoms.insert(d, tr.g.new(out.shape[d], pinned=True))
        tr._set(out, atoms, parity, data)
        return
    d = d % out.dim()
    for k in range(out.dim()):
        if k != d:
            for atoms in recs[1:]:
                tr.g.unify(recs[0][k], atoms[k], f"{name}: a fixed tensor is concatenated with a hidden one")
    atoms = list(recs[0])
    atoms[d] = tr.g.fused([a[d] for a in recs if tr.g.size[tr.g.find(a[d])] > 0])
    tr._set(out, atoms, parity, data)


def _index(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    r = tr.rec(x)
    if name == "narrow":
        d = args[1] % x.dim()
        idx = [slice(None)] * d + [slice(args[2], args[2] + args[3])]
    elif name == "select":
        d = args[1] % x.dim()
        idx = [slice(None)] * d + [args[2]]
    else:
        idx = args[1] if isinstance(args[1], tuple) else (args[1],)
    idx = list(idx)
    if any(i is Ellipsis for i in idx):
        e = idx.index(Ellipsis)
        fill = x.dim() - sum(1 for i in idx if i is not None and i is not Ellipsis)
        idx = idx[:e] + [slice(None)] * fill + idx[e + 1:]
    atoms, k = [], 0
    for i in idx:
        if i is None:
            atoms.append(tr.g.new(1))
            continue
        if k >= x.dim():
            raise NotImplementedError
        a, n = r.atoms[k], x.shape[k]
        if isinstance(i, slice):
            if i.indices(n) == (0, n, 1):
                atoms.append(a)
            else:
                if not tr.g.is_pinned(a):
                    tr.g.pin(a, "slicing part of the axis (as rotary embeddings' rotate_half does, or a position "
                                "table cut to the inputs' length)")
                atoms.append(tr.g.new(len(range(*i.indices(n))), pinned=True))
        elif isinstance(i, int) or (isinstance(i, torch.Tensor) and i.dim() == 0):
            if n > 1 and not tr.g.is_pinned(a):
                tr.g.pin(a, "indexing one coordinate of the axis")
        else:
            raise NotImplementedError  # advanced indexing
        k += 1
    atoms += r.atoms[k:]
    if len(atoms) != out.dim():
        raise NotImplementedError
    tr._set(out, atoms, r.parity, r.data, r.why)


# ---------------------------------------------------------------- the table
# operation name (`op_name`) -> handler. symo/infer/handlers.py joins this table with ops' and ops_nn's.
HANDLERS: dict[str, Handler] = {
    **dict.fromkeys(RESHAPE, _reshape),
    **dict.fromkeys(("transpose", "swapaxes", "swapdims", "t", "permute", "movedim", "moveaxis", "T", "mT",
                     "adjoint", "mH", "H"), _permute),
    **dict.fromkeys(("expand", "expand_as", "broadcast_to", "repeat", "tile"), _expand),
    **dict.fromkeys(("split", "chunk", "tensor_split", "split_with_sizes", "unbind", "unsafe_split"), _split),
    **dict.fromkeys(("cat", "concat", "concatenate", "stack", "hstack", "vstack"), _cat),
    **dict.fromkeys(("__getitem__", "narrow", "select"), _index),
}
