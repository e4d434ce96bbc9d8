"""Handlers for layers: linear maps, attention, embeddings, normalisation, convolution and pooling.

See symo/infer/ops.py and symo/infer/ops_shape.py for the element-wise and shape handlers and the conventions.

A handler gets the operation's arguments and its real output, unifies, refines, pins or caps the atoms
of the tensors involved, and records the output's atoms and parity. Raising NotImplementedError makes
the operation "unsupported": its axes are left free and it is reported by name.
"""

from __future__ import annotations

import torch

from .trace import (
    LIN,
    NONE,
    ODD,
    Handler,
    Tracer,
    _arg,
)


def _note_out(tr: Tracer, w, axis: int) -> None:
    name = tr.param_ids.get(id(w))
    if name is not None:
        tr.out_axis.setdefault(name, axis)


def _linear(tr: Tracer, name, args, kwargs, out):
    x, w = args[0], _arg(args, kwargs, 1, "weight")
    b = _arg(args, kwargs, 2, "bias")
    xa, wa = tr.atoms(x), tr.atoms(w)
    tr.consume(x)
    fixed = "a fixed (non-parameter) matrix mixes the axis" if tr.rec(w) is None else None
    if w.dim() == 1:
        tr.g.unify(wa[0], xa[-1], fixed)
        tr._set(out, xa[:-1], LIN)
        return
    tr.g.unify(wa[1], xa[-1], fixed)
    if b is not None:
        tr.g.unify(tr.atoms(b)[0], wa[0], "a fixed bias" if tr.rec(b) is None else None)
    _note_out(tr, w, 0)
    tr._set(out, xa[:-1] + [wa[0]], LIN)


def _addmm(tr: Tracer, name, args, kwargs, out):
    b, m1, m2 = args[0], args[1], args[2]
    a1, a2 = tr.atoms(m1), tr.atoms(m2)
    tr.consume(m1)
    tr.consume(m2)
    tr.g.unify(a1[1], a2[0], "a fixed (non-parameter) matrix mixes the axis"
               if (tr.rec(m1) is None or tr.rec(m2) is None) else None)
    if isinstance(b, torch.Tensor):  # the bias broadcasts against the product (rows, cols)
        ba = tr.atoms(b)
        fixed = "a fixed bias" if tr.rec(b) is None else None
        for k, target in zip(range(b.dim()), ([a2[1]] if b.dim() == 1 else [a1[0], a2[1]])):
            if b.shape[k] > 1:
                tr.g.unify(ba[k], target, fixed)
    _note_out(tr, m2, 1)
    tr._set(out, [a1[0], a2[1]], LIN)


def _matmul(tr: Tracer, name, args, kwargs, out):
    a, b = (args[1], args[0]) if name == "__rmatmul__" else (args[0], args[1])
    A, B = list(tr.atoms(a)), list(tr.atoms(b))
    drop_a, drop_b = a.dim() == 1, b.dim() == 1
    if drop_a:
        A = [tr.g.new(1)] + A
    if drop_b:
        B = B + [tr.g.new(1)]
    ra, rb = tr.rec(a), tr.rec(b)
    moving_a, moving_b = ra is not None and not ra.data, rb is not None and not rb.data
    fixed = "a fixed (non-parameter) matrix mixes the axis" if (ra is None or rb is None) else None
    tr.g.unify(A[-1], B[-2], fixed)
    if moving_a and moving_b:
        pa, pb = ra.parity, rb.parity
        if {pa, pb} <= {LIN, ODD}:
            if {pa, pb} != {LIN}:
                tr.g.cap(A[-1], "signed_perm", "a contraction of odd functions")
        else:
            tr.g.cap(A[-1], "perm", "a contraction of non-odd functions")
        if id(a) not in tr.param_ids and id(b) not in tr.param_ids:
            tr.g.role(A[-1], "qk")
        if ra.why in ("softmax", "_softmax"):
            tr.g.role(B[-1], "vo")
    else:
        for t, moving in ((a, moving_a), (b, moving_b)):
            if moving:
                tr.consume(t, atoms=[A[-1]])
    batch_a, batch_b = A[:-2], B[:-2]
    batch = []
    for k in range(max(len(batch_a), len(batch_b))):
        xa = batch_a[len(batch_a) - 1 - k] if k < len(batch_a) else None
        xb = batch_b[len(batch_b) - 1 - k] if k < len(batch_b) else None
        sa = tr.g.size[tr.g.find(xa)] if xa is not None else 1
        sb = tr.g.size[tr.g.find(xb)] if xb is not None else 1
        if sa > 1 and sb > 1:
            tr.g.unify(xa, xb, fixed)
        batch.append(xa if sa > 1 or xb is None else xb)
    batch = batch[::-1]
    if moving_a and moving_b:
        for x in batch:
            tr.g.role(x, "head")
    if id(b) in tr.param_ids:
        tr.out_axis.setdefault(tr.param_ids[id(b)], b.dim() - 1)
    atoms = batch + ([] if drop_a else [A[-2]]) + ([] if drop_b else [B[-1]])
    if len(atoms) != out.dim():
        raise NotImplementedError
    tr._set(out, atoms, LIN, (ra is None or ra.data) and (rb is None or rb.data))


def _sdpa(tr: Tracer, name, args, kwargs, out):
    q, k, v = args[0], _arg(args, kwargs, 1, "key"), _arg(args, kwargs, 2, "value")
    mask = _arg(args, kwargs, 3, "attn_mask")
    Q, K, V = tr.atoms(q), tr.atoms(k), tr.atoms(v)
    if not (q.dim() == k.dim() == v.dim()) or q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise NotImplementedError  # grouped-query or broadcast attention: not analysed
    for i in range(q.dim() - 2):
        tr.g.unify(Q[i], K[i])
        tr.g.unify(Q[i], V[i])
        tr.g.role(Q[i], "head")
    tr.g.unify(Q[-1], K[-1])
    tr.g.unify(K[-2], V[-2])
    tr.g.role(Q[-1], "qk")
    tr.g.role(V[-1], "vo")
    pq, pk = tr.parity(q), tr.parity(k)
    if {pq, pk} - {LIN}:
        tr.g.cap(Q[-1], "signed_perm" if {pq, pk} <= {LIN, ODD} else "perm",
                 "queries or keys are element-wise functions of a hidden axis")
    tr.consume(v, atoms=[V[-1]]) if tr.parity(v) != LIN else None
    if isinstance(mask, torch.Tensor) and tr.rec(mask) is not None and not tr.rec(mask).data:
        raise NotImplementedError  # a learned attention bias: not analysed
    if isinstance(mask, torch.Tensor):
        _pin_heads_by_mask(tr, Q[:-2], mask, mask.dim() - q.dim())
    tr._set(out, Q[:-1] + [V[-1]], LIN)


HEADS_TIED = "a fixed attention mask or bias differs between heads (e.g. ALiBi slopes), so each head keeps its slot"


def _pin_heads_by_mask(tr: Tracer, lead: list[int], mask: torch.Tensor, shift: int) -> None:
    """A fixed mask (or additive bias) that differs along a leading axis of the queries (the heads) ties
    that axis to its slots: it is pinned, and the heads stay in place (their per-head groups are kept).
    `shift` is where the mask's axes sit against the queries' (mask axis = query axis + shift); a mask
    equal along an axis (broadcast, or the same values repeated) leaves that axis alone."""
    for i, atom in enumerate(lead):
        j = i + shift
        if j < 0 or mask.shape[j] == 1 or tr.g.is_pinned(atom):  # the batch axis is the inputs': pinned already
            continue
        first = mask.narrow(j, 0, 1)
        if not torch.equal(mask, first.expand_as(mask)):
            tr.g.pin(atom, HEADS_TIED)


def _embedding(tr: Tracer, name, args, kwargs, out):
    idx, w = args[0], _arg(args, kwargs, 1, "weight")
    wa = tr.atoms(w)
    tr.g.pin(wa[0])  # rows are indexed by token ids: data
    tr._set(out, tr.atoms(idx) + [wa[1]], LIN)


def _norm(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    shape = _arg(args, kwargs, 1, "normalized_shape")
    w = _arg(args, kwargs, 2, "weight")
    b = _arg(args, kwargs, 3, "bias") if name == "layer_norm" else None
    r = tr.rec(x)
    n = len(shape) if isinstance(shape, (list, tuple, torch.Size)) else 1
    normed = r.atoms[x.dim() - n:]
    for t in (w, b):
        if isinstance(t, torch.Tensor):
            ta = tr.atoms(t)
            for i in range(n):
                tr.g.unify(normed[i], ta[i], f"{name}: fixed affine parameters" if tr.rec(t) is None else None)
    parity = LIN
    if name == "layer_norm":
        for a in normed:
            tr.g.cap(a, "perm", "LayerNorm subtracts the mean over the axis (sign flips and rotations move it)")
        parity = NONE
    else:
        tr.consume(x, how="reduce", atoms=normed)
        if isinstance(w, torch.Tensor):
            for a in normed:
                tr.g.cap(a, "perm", "a per-channel gain moves with permutations only")
            parity = NONE
    tr._set(out, r.atoms, parity)
    tr.recs[id(out)].why = name


def _batch_norm(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    rm = _arg(args, kwargs, 1, "running_mean")
    w, b = _arg(args, kwargs, 3, "weight"), _arg(args, kwargs, 4, "bias")
    training = _arg(args, kwargs, 5, "training", False) if name == "batch_norm" else True
    r = tr.rec(x)
    c = r.atoms[1] if x.dim() > 1 else r.atoms[0]
    tr.consume(x, atoms=[c])
    for t in (w, b):
        if isinstance(t, torch.Tensor):
            tr.g.unify(c, tr.atoms(t)[0], f"{name}: fixed affine parameters" if tr.rec(t) is None else None)
    if not training and isinstance(rm, torch.Tensor):
        note = (f"{name} in eval mode reads running statistics (buffers): a channel permutation must move them "
                "too; the spec covers parameters only, so the check runs with the buffers as they are")
        if note not in tr.notes:
            tr.notes.append(note)
    parity = ODD if (training and w is None) else NONE
    if isinstance(w, torch.Tensor):
        tr.g.cap(c, "perm", f"{name}'s per-channel gain moves with permutations only")
    tr._set(out, r.atoms, parity)
    tr.recs[id(out)].why = name


def _group_norm(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    r = tr.rec(x)
    groups = _arg(args, kwargs, 1, "num_groups")
    c = r.atoms[1]
    if groups == 1:
        tr.g.cap(c, "perm", "GroupNorm subtracts a mean over the channels")
    elif groups != x.shape[1]:
        tr.g.pin(c, "GroupNorm normalises channels in groups (permutations across groups change it)")
    for t in (_arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias")):
        if isinstance(t, torch.Tensor):
            tr.g.unify(c, tr.atoms(t)[0])
            tr.g.cap(c, "perm", "a per-channel gain moves with permutations only")
    tr._set(out, r.atoms, NONE)


def _conv(tr: Tracer, name, args, kwargs, out):
    x, w = args[0], _arg(args, kwargs, 1, "weight")
    b = _arg(args, kwargs, 2, "bias")
    groups = kwargs.get("groups", args[6] if len(args) > 6 else 1)
    if "transpose" in name:
        groups = kwargs.get("groups", args[6] if len(args) > 6 else 1)
    xa, wa = tr.atoms(x), tr.atoms(w)
    batched = x.dim() == w.dim()
    c_in = xa[1] if batched else xa[0]
    for a in wa[2:]:
        tr.g.pin(a)  # kernel offsets: spatial data
    transpose = "transpose" in name
    i_in, i_out = (0, 1) if transpose else (1, 0)
    tr.consume(x, atoms=[c_in])
    if groups == 1:
        tr.g.unify(wa[i_in], c_in, "a fixed (non-parameter) kernel mixes the channels" if tr.rec(w) is None else None)
        c_out = wa[i_out]
    elif not transpose and groups == x.shape[1 if batched else 0] == w.shape[0]:  # depthwise
        tr.g.pin(wa[1])
        tr.g.unify(wa[0], c_in)
        tr.g.cap(c_in, "perm", "a depthwise convolution has per-channel filters")
        c_out = c_in
    else:
        raise NotImplementedError
    if isinstance(b, torch.Tensor):
        tr.g.unify(tr.atoms(b)[0], c_out)
    _note_out(tr, w, i_out)
    spatial = [tr.g.new(s, pinned=True) for s in out.shape[(2 if batched else 1):]]
    tr._set(out, ([xa[0]] if batched else []) + [c_out] + spatial, LIN)


def _pool(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    r = tr.rec(x)
    res = out[0] if isinstance(out, (tuple, list)) else out
    k = 3 if "3d" in name else 2 if "2d" in name else 1
    lead = r.atoms[: x.dim() - k]
    parity = NONE if "max" in name else r.parity
    if "max" in name:
        tr.consume(x, atoms=lead)
        for a in lead:
            tr.g.cap(a, "perm", f"{name} is not odd")
    atoms = lead + [tr.g.new(s, pinned=True) for s in res.shape[x.dim() - k:]]
    tr._set(res, atoms, parity)
    if parity == NONE:
        tr.recs[id(res)].why = name


def _normalize(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    r = tr.rec(x)
    p = _arg(args, kwargs, 1, "p", 2.0)
    dim = _arg(args, kwargs, 2, "dim", 1) % x.dim()
    if p != 2:
        tr.g.cap(r.atoms[dim], "signed_perm", "a p-norm with p != 2 is not rotation invariant")
    tr.consume(x, how="reduce", atoms=[r.atoms[dim]]) if r.parity != LIN else None
    tr._set(out, r.atoms, r.parity)


def _mha(tr: Tracer, name, args, kwargs, out):
    """nn.MultiheadAttention's packed projections: in_proj rows [(head dqk) | (head dqk) | (head dvo)]."""
    names = ["query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias", "bias_k",
             "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias"]
    a = dict(zip(names, args))
    a.update({k: v for k, v in kwargs.items() if k in names})
    if (a.get("bias_k") is not None or a.get("bias_v") is not None or a.get("add_zero_attn")
            or kwargs.get("use_separate_proj_weight") or not isinstance(a.get("in_proj_weight"), torch.Tensor)):
        raise NotImplementedError
    q, k, v = a["query"], a["key"], a["value"]
    heads, e = a["num_heads"], q.shape[-1]
    w_in, b_in, w_out, b_out = a["in_proj_weight"], a.get("in_proj_bias"), a["out_proj_weight"], a.get("out_proj_bias")
    if e % heads or k.shape[-1] != e or v.shape[-1] != e:
        raise NotImplementedError
    g = tr.g
    h, dqk, dvo = g.new(heads), g.new(e // heads), g.new(e // heads)
    g.role(h, "head")
    g.role(dqk, "qk")
    g.role(dvo, "vo")
    rows = g.fused([g.product([h, dqk]), g.product([h, dqk]), g.product([h, dvo])])
    wa = tr.atoms(w_in)
    g.unify(wa[0], rows)
    for t in (q, k, v):
        tr.consume(t)
        g.unify(wa[1], tr.atoms(t)[-1], "a fixed (non-parameter) input projection" if tr.rec(w_in) is None else None)
    if isinstance(b_in, torch.Tensor):
        g.unify(tr.atoms(b_in)[0], rows)
    oa = tr.atoms(w_out)
    g.unify(oa[1], g.product([h, dvo]))
    if isinstance(b_out, torch.Tensor):
        g.unify(tr.atoms(b_out)[0], oa[0])
    _note_out(tr, w_in, 0)
    _note_out(tr, w_out, 0)
    mask = _arg(args, kwargs, 16, "attn_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 3 and mask.shape[0] % heads == 0:
        # (batch * heads, L, S): one mask per head; seen as (batch, heads, L, S), the heads are axis 1
        per_head = mask.reshape(mask.shape[0] // heads, heads, *mask.shape[1:])
        _pin_heads_by_mask(tr, [g.new(per_head.shape[0], pinned=True), h], per_head, 0)
    res = out[0] if isinstance(out, (tuple, list)) else out
    tr._set(res, tr.atoms(q)[:-1] + [oa[0]], LIN)
    if isinstance(out, (tuple, list)) and len(out) > 1 and isinstance(out[1], torch.Tensor):
        tr._set(out[1], [g.new(s, pinned=True) for s in out[1].shape], NONE)


# ---------------------------------------------------------------- the tables
# operation name (`op_name`) -> handler; symo/infer/handlers.py joins this table with ops.py's.
HANDLERS: dict[str, Handler] = {
    "linear": _linear,
    "addmm": _addmm,
    **dict.fromkeys(("matmul", "mm", "bmm", "__matmul__", "__rmatmul__"), _matmul),
    "scaled_dot_product_attention": _sdpa,
    "embedding": _embedding,
    "layer_norm": _norm, "rms_norm": _norm,
    "batch_norm": _batch_norm, "instance_norm": _batch_norm,
    "group_norm": _group_norm,
    **dict.fromkeys(("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"), _conv),
    "normalize": _normalize,
    "multi_head_attention_forward": _mha,
}
# names matched by their start (max_pool1d/2d/3d, adaptive_avg_pool2d, ...), tried in order for a name not in
# HANDLERS
PREFIX_HANDLERS: tuple[tuple[str, Handler], ...] = (
    ("max_pool", _pool), ("avg_pool", _pool), ("adaptive_avg_pool", _pool), ("adaptive_max_pool", _pool),
    ("lp_pool", _pool),
)
