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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .axes import AxisGraph

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


# A handler: (tracer, operation name, args, kwargs, the real output) -> None; it raises (NotImplementedError or
# any other error) for an argument pattern it does not know, and the operation is then reported as unsupported.
Handler = Callable[["Tracer", str, tuple, dict, Any], None]


class Tracer(TorchFunctionMode):
    """Records parameter-dependent torch calls into an `AxisGraph`.

    `handlers` maps an operation's name (`op_name`) to its handler; `prefix_handlers` are tried in order
    for a name the table lacks (`max_pool2d` -> "max_pool"). symo.infer.handlers builds both tables. An
    operation neither knows is recorded as unsupported: its axes are pinned and it is reported by name."""

    def __init__(self, handlers: Mapping[str, Handler], prefix_handlers: Sequence[tuple[str, Handler]] = ()) -> None:
        super().__init__()
        if not handlers:  # every operation would be "unsupported": a wiring mistake, not a model property
            raise ValueError("Tracer needs the operation handlers (symo.infer.handlers.HANDLERS)")
        self.handlers = handlers
        self.prefix_handlers = tuple(prefix_handlers)
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
            cap = ("perm" if how == "linear" else "signed_perm",
                   "an even element-wise function or a product (e.g. a per-channel gain: it moves by |Q|)")
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
        handler = self.handlers.get(name)
        if handler is None:
            for key, h in self.prefix_handlers:
                if name.startswith(key):
                    handler = h
                    break
        try:
            if handler is None:
                raise NotImplementedError
            handler(self, name, args, kwargs, out)
        except Exception:  # noqa: BLE001  (an argument pattern a handler does not know: unsupported, not fatal)
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
