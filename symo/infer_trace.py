"""Record one eager forward pass at the torch-function level and build the axis graph (`AxisGraph`).

Why this tracer (docs/infer.md has the long version): a `TorchFunctionMode` sees every torch call of
a real forward pass with its real arguments and shapes, at the level users write code
(`F.linear`, `Tensor.view`, `F.scaled_dot_product_attention`, Hugging Face's `torch.addmm`), so
data-dependent Python control flow, `**kwargs` models and Hugging Face code run unchanged (torch.fx
cannot trace them without a model-specific tracer), it costs one forward pass (torch.export of
GPT-2 124M takes several seconds), and parameters are found by tensor identity, so tied weights are
one parameter.

Every tensor that depends on a parameter gets a record: one atom per axis and a *parity*, how it
transforms under the group acting on its axes:

    LIN   linear in the space (transforms as Q x): any group, O(n) included
    ODD   an odd element-wise function of LIN (tanh): sign flips and permutations
    EVEN  an even element-wise function (|x|, x * y): permutations, signs drop out
    SQ    the element-wise square of LIN: its sum over the axis is O(n)-invariant (RMSNorm)
    INV   invariant (a norm, a mean over the space)
    NONE  permutation-equivariant only (ReLU, GELU, x + 1)

A group is capped where a tensor is *consumed* (a Linear, a reduction, the output), so an element-wise
chain such as GELU's `0.5 x (1 + tanh(...))` is judged as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

from .infer_axes import AxisGraph

LIN, ODD, EVEN, SQ, INV, NONE, CONST = "LIN", "ODD", "EVEN", "SQ", "INV", "NONE", "CONST"

ODD_FN = {"tanh", "sin", "sinh", "asinh", "arcsinh", "atan", "arctan", "erf", "neg", "negative", "__neg__", "sign",
          "sgn", "tan", "asin", "arcsin", "atanh", "arctanh", "erfinv", "softsign", "tanhshrink", "hardshrink",
          "softshrink", "trunc", "fix"}
EVEN_FN = {"abs", "absolute", "cos", "cosh", "square"}
OTHER_FN = {"relu", "gelu", "silu", "sigmoid", "exp", "log", "sqrt", "rsqrt", "reciprocal", "softplus", "elu",
            "leaky_relu", "relu6", "hardswish", "hardsigmoid", "mish", "selu", "celu", "logsigmoid", "clamp", "clip",
            "clamp_min", "clamp_max", "floor", "ceil", "round", "expm1", "log1p", "exp2", "log2", "log10", "threshold",
            "softmax", "log_softmax", "_softmax", "hardtanh", "nan_to_num", "eq", "ne", "lt", "le", "gt", "ge",
            "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "isfinite", "isnan", "isinf", "logical_not",
            "erfc", "digamma", "lgamma", "sinc", "frac", "silu_", "gelu_"}
IDENTITY = {"contiguous", "clone", "detach", "to", "type", "type_as", "float", "double", "half", "bfloat16", "cpu",
            "cuda", "requires_grad_", "alias", "positive", "__pos__", "data", "real", "view_as_real_copy"}
DROPOUT = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
           "feature_dropout"}
LOSSES = {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy", "kl_div", "smooth_l1_loss",
          "binary_cross_entropy_with_logits", "huber_loss", "cosine_embedding_loss"}
STATIC_OUT = {"zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "new_zeros", "new_ones",
              "new_empty", "new_full", "new_tensor", "randint_like"}
RESHAPE = {"view", "reshape", "view_as", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze", "ravel"}
REDUCE = {"sum", "mean", "amax", "amin", "max", "min", "var", "std", "logsumexp", "norm", "prod", "nansum", "nanmean",
          "vector_norm", "linalg_vector_norm", "all", "any", "var_mean", "std_mean"}
BINARY = {"add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "rsub", "__add__", "__radd__",
          "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__", "__imul__", "__truediv__",
          "__rtruediv__", "__itruediv__", "__div__", "__rdiv__", "maximum", "minimum", "fmax", "fmin", "where",
          "masked_fill", "pow", "__pow__", "float_power"}


@dataclass
class Rec:
    """What the trace knows about one tensor: an atom per axis, its parity, and whether it is data
    (derived from the inputs only) rather than from parameters."""

    atoms: list[int]
    parity: str
    data: bool = False
    why: str | None = None  # the operation that made the parity NONE, for reports


@dataclass
class TraceResult:
    graph: AxisGraph
    param_atoms: dict[str, list[int]]
    out_axis: dict[str, int]  # parameter -> the axis that indexes the layer's outputs (rows)
    unknown: list[tuple[str, list[int]]]  # unsupported operations and the atoms they touched
    notes: list[str] = field(default_factory=list)
    ops: int = 0
    used: set[str] = field(default_factory=set)


def op_name(func) -> str:
    name = getattr(func, "__name__", "") or ""
    if name == "__get__":
        name = getattr(getattr(func, "__self__", None), "__name__", "__get__")
    if name.endswith("_") and not name.endswith("__") and name.rstrip("_") and name not in ("requires_grad_",):
        name = name[:-1]  # in-place variant: add_ -> add (the result replaces the input's record)
    return name


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def _arg(args, kwargs, i, name, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


class Tracer(TorchFunctionMode):
    """Records parameter-dependent torch calls into an `AxisGraph`."""

    def __init__(self) -> None:
        super().__init__()
        self.g = AxisGraph()
        self.recs: dict[int, Rec] = {}
        self.keep: list[torch.Tensor] = []  # records are keyed by id(): keep tensors alive
        self.param_atoms: dict[str, list[int]] = {}
        self.param_ids: dict[int, str] = {}
        self.out_axis: dict[str, int] = {}
        self.unknown: list[tuple[str, list[int]]] = []
        self.notes: list[str] = []
        self.used: set[str] = set()  # parameters some traced operation read
        self.ops = 0

    # ------------------------------------------------------------ records
    def add_param(self, name: str, p: torch.Tensor) -> None:
        atoms = [self.g.new(s) for s in p.shape]
        self.param_atoms[name] = atoms
        self.param_ids[id(p)] = name
        self._set(p, atoms, LIN)

    def add_data(self, t: torch.Tensor) -> None:
        self._set(t, [self.g.new(s, pinned=True) for s in t.shape], CONST, data=True)

    def _set(self, t: torch.Tensor, atoms: list[int], parity: str, data: bool = False, why: str | None = None) -> None:
        self.recs[id(t)] = Rec(list(atoms), parity, data, why if parity == NONE else None)
        self.keep.append(t)

    def rec(self, t) -> Rec | None:
        return self.recs.get(id(t)) if isinstance(t, torch.Tensor) else None

    def atoms(self, t) -> list[int]:
        """A tensor's atoms; a fixed tensor (a buffer, a constant) gets pinned ones."""
        r = self.rec(t)
        if r is not None:
            return r.atoms
        return [self.g.new(s, pinned=True) for s in t.shape]

    def parity(self, t) -> str:
        r = self.rec(t)
        if r is None or r.data:
            return CONST
        return r.parity

    def consume(self, t, how: str = "linear", atoms: list[int] | None = None) -> None:
        """Cap the groups on `atoms` (default: all of t's) by how t's parity allows it to be used."""
        r = self.rec(t)
        if r is None or r.data:
            return
        atoms = r.atoms if atoms is None else atoms
        p = r.parity
        cap = None
        if p == ODD:
            cap = ("signed_perm", "an odd element-wise function (sign flips and permutations commute with it)")
        elif p == EVEN:
            cap = ("perm" if how == "linear" else "signed_perm", "an even element-wise function")
        elif p == SQ and how == "linear":
            cap = ("perm", "an element-wise square")
        elif p == NONE:
            cap = ("perm", f"a non-odd element-wise function ({r.why or 'ReLU, GELU, x + c, ...'})")
        if cap:
            for a in atoms:
                self.g.cap(a, *cap)

    # ------------------------------------------------------------ the mode
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = op_name(func)
        if name in DROPOUT:  # the identity: a random mask is another draw each step, and no parameter moves it
            return args[0] if args else kwargs["input"]
        if name == "scaled_dot_product_attention":
            kwargs = dict(kwargs)
            if len(args) > 4:
                args = tuple(args[:4]) + (0.0,) + tuple(args[5:])
            else:
                kwargs["dropout_p"] = 0.0
        out = func(*args, **kwargs)
        ins = list(_tensors((args, kwargs)))
        recs = [self.recs[id(t)] for t in ins if id(t) in self.recs]
        self.used.update(self.param_ids[id(t)] for t in ins if id(t) in self.param_ids)
        if not recs or not any(isinstance(t, torch.Tensor) for t in _tensors(out)):
            return out
        self.ops += 1
        if all(r.data for r in recs):  # computed from the inputs alone: fixed data
            for t in _tensors(out):
                self._set(t, [self.g.new(s, pinned=True) for s in t.shape], CONST, data=True)
            return out
        handler = _HANDLERS.get(name)
        if handler is None:
            for key, h in _PREFIX_HANDLERS:
                if name.startswith(key):
                    handler = h
                    break
        try:
            if handler is None:
                raise NotImplementedError
            handler(self, name, args, kwargs, out)
        except NotImplementedError:
            self._unknown(name, ins, out)
        return out

    def _unknown(self, name: str, ins, out) -> None:
        touched = [a for t in ins if (r := self.rec(t)) is not None and not r.data for a in r.atoms]
        for a in touched:
            self.g.pin(a, f"unsupported operation {name!r}")
        outs = []
        for t in _tensors(out):
            atoms = [self.g.new(s, pinned=True) for s in t.shape]
            for a in atoms:
                self.g.pin(a, f"unsupported operation {name!r}")
            outs += atoms
            self._set(t, atoms, NONE)
        self.unknown.append((name, touched + outs))


# ---------------------------------------------------------------- handlers
_HANDLERS: dict = {}
_PREFIX_HANDLERS: list = []


def _handles(*names):
    def deco(fn):
        for n in names:
            _HANDLERS[n] = fn
        return fn
    return deco


@_handles(*IDENTITY)
def _identity(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(x.shape):
        raise NotImplementedError
    r = tr.rec(x)
    tr._set(out, r.atoms, r.parity, r.data, r.why)


@_handles(*STATIC_OUT)
def _static_out(tr: Tracer, name, args, kwargs, out):
    return  # a fresh tensor of the same shape: fixed, no record


@_handles(*LOSSES)
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


@_handles(*(ODD_FN | EVEN_FN | OTHER_FN))
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


def _varies_along_all(t, out) -> bool:
    """Does t have extent along every output axis of size > 1 (no broadcasting)?"""
    if not isinstance(t, torch.Tensor):
        return False
    shape = (1,) * (out.dim() - t.dim()) + tuple(t.shape)
    return all(s > 1 or o == 1 for s, o in zip(shape, out.shape))


@_handles(*BINARY)
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


@_handles(*REDUCE)
def _reduce(tr: Tracer, name, args, kwargs, out):
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


@_handles(*RESHAPE)
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


@_handles("transpose", "swapaxes", "swapdims", "t", "permute", "movedim", "moveaxis", "T", "mT", "adjoint", "mH", "H")
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


@_handles("expand", "expand_as", "broadcast_to", "repeat", "tile")
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


@_handles("split", "chunk", "tensor_split", "split_with_sizes", "unbind", "unsafe_split")
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


@_handles("cat", "concat", "concatenate", "stack", "hstack", "vstack")
def _cat(tr: Tracer, name, args, kwargs, out):
    tensors = list(args[0] if args else kwargs["tensors"])
    d = _arg(args, kwargs, 1, "dim", 0)
    if name in ("hstack", "vstack"):
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


@_handles("__getitem__", "narrow", "select")
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
                    tr.g.pin(a, "slicing part of the axis (e.g. rotary embeddings' rotate_half)")
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


def _note_out(tr: Tracer, w, axis: int) -> None:
    name = tr.param_ids.get(id(w))
    if name is not None:
        tr.out_axis.setdefault(name, axis)


@_handles("linear")
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


@_handles("addmm")
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


@_handles("matmul", "mm", "bmm", "__matmul__", "__rmatmul__")
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


@_handles("scaled_dot_product_attention")
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
    tr._set(out, Q[:-1] + [V[-1]], LIN)


@_handles("embedding")
def _embedding(tr: Tracer, name, args, kwargs, out):
    idx, w = args[0], _arg(args, kwargs, 1, "weight")
    wa = tr.atoms(w)
    tr.g.pin(wa[0])  # rows are indexed by token ids: data
    tr._set(out, tr.atoms(idx) + [wa[1]], LIN)


@_handles("layer_norm", "rms_norm")
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


@_handles("batch_norm", "instance_norm")
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


@_handles("group_norm")
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


for _n in ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
    _HANDLERS[_n] = _conv


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


_PREFIX_HANDLERS.extend([("max_pool", _pool), ("avg_pool", _pool), ("adaptive_avg_pool", _pool),
                         ("adaptive_max_pool", _pool), ("lp_pool", _pool)])


@_handles("normalize")
def _normalize(tr: Tracer, name, args, kwargs, out):
    x = args[0]
    r = tr.rec(x)
    p = _arg(args, kwargs, 1, "p", 2.0)
    dim = _arg(args, kwargs, 2, "dim", 1) % x.dim()
    if p != 2:
        tr.g.cap(r.atoms[dim], "signed_perm", "a p-norm with p != 2 is not rotation invariant")
    tr.consume(x, how="reduce", atoms=[r.atoms[dim]]) if r.parity != LIN else None
    tr._set(out, r.atoms, r.parity)
