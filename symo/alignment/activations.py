"""Activation matching: each space's element from the correlations of the hidden units' activations on data.

Git Re-Basin's activation matching (Ainsworth et al., ICLR 2023), located through the spec. A space is
found in the forward pass where a module's weight carries it on a feature axis: the *input* of an
`nn.Linear` / convolution whose weight's input axis holds the space (the units after the nonlinearity),
else the *output* of one whose weight's output axis holds it (before it). An `nn.MultiheadAttention`
counts by its `in_proj_weight`: its query input, and q, k, v computed from its inputs (it never calls
its `out_proj` as a module, and a module whose forward does not run on the first batch is no site).
A fused axis is cut at the block's slice (c_attn's q, k and v) and a product axis reshaped
(`(head d_head)`): a `per` space gives one statistic per index of its owner. Forward hooks record those
tensors for the same batches through both models; per space

- `perm`, `signed_perm`: the cross-correlation of the units, summed over the places the space was found,
  solved by linear assignment (of |corr| with its signs for signed_perm);
- `orthogonal`: the cross-covariance, solved by Procrustes.

Hidden activations do not depend on how the other spaces are permuted or rotated (for true symmetries),
so every located space is solved once, independently. Spaces that cannot be located (a recurrent
weight, a space sharing its axis with another group) are left to weight matching.

Heads permuted as wholes (per-spaces under a perm or signed_perm owner): every pair of heads gets its
statistic, the owner's element is the linear assignment of the pairs' best values (a rotation's: the nuclear
norm of the pair's cross-covariance), and each paired head its elements (`solve.solve_heads`). Where one
of the owner's per-spaces cannot be located, the owner and its per-spaces are all left to weight matching,
which solves them jointly.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.compiled import CompiledSpec
from .matching import moving_per_spaces
from .solve import solve_heads, solve_linear

# weight axis -> (side of the module, feature dimension of that tensor), per module type
_LINEAR = {0: ("output", -1), 1: ("input", -1)}
_CONV = {0: ("output", 1), 1: ("input", 1)}
_EMBEDDING = {1: ("output", -1)}
_ATTENTION = {0: ("projection", -1), 1: ("input", -1)}  # in_proj_weight: rows q, k, v; columns the query's features


@dataclass(frozen=True)
class Site:
    """Where a space shows in the forward pass: `side` of module `module` ("input", "output", or an
    attention's "projection", its q, k, v), feature dimension `dim`, the slice [start, start + length)
    reshaped to `sizes`; the space is atom `k` (its owner atom `owner`)."""

    module: str
    side: str
    dim: int
    start: int
    length: int
    sizes: tuple[int, ...]
    k: int
    owner: int | None


def locate(model: nn.Module, compiled: CompiledSpec, called: set[str] | None = None) -> dict[str, list[Site]]:
    """{space: sites}: input sides where there are any, else the others (module docstring); `called`: the
    modules whose forward runs (None: all)."""
    names = {}
    for n, p in model.named_parameters():
        names.setdefault(id(p), n)
    found: dict[str, list[Site]] = {}
    for mod_name, module in model.named_modules():
        weight, axes = _weight_axes(module)
        param = names.get(id(weight)) if isinstance(weight, nn.Parameter) else None
        if not axes or param not in compiled.shapes or (called is not None and mod_name not in called):
            continue
        for block in compiled.param_blocks(param):
            for axis, (side, dim) in axes.items():
                start, length = block["slices"][axis]
                atoms = block["axes"][axis]
                for k, (space, _) in enumerate(atoms):
                    site = _site(compiled, mod_name, side, dim, start, length, atoms, k, space)
                    if site is not None:
                        found.setdefault(space, []).append(site)
    return {s: [x for x in sites if x.side == "input"] or sites for s, sites in found.items()}


def _weight_axes(module: nn.Module) -> tuple[Any, dict[int, tuple[str, int]]]:
    """The module's weight that locates spaces, and its axes' sides."""
    if isinstance(module, nn.MultiheadAttention):
        return module.in_proj_weight, _ATTENTION  # None with separate q, k, v weights (kdim, vdim): not located
    weight = getattr(module, "weight", None)
    if isinstance(module, nn.Linear):
        return weight, _LINEAR
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and module.groups == 1:
        return weight, _CONV
    if isinstance(module, nn.Embedding):
        return weight, _EMBEDDING
    return weight, {}


def _site(compiled: CompiledSpec, module: str, side: str, dim: int, start: int, length: int,
          atoms: list[tuple[str | None, int]], k: int, space: str | None) -> Site | None:
    """A site for atom k, if it holds a moving space and every other atom of the axis is fixed there (a
    free atom, an identity space, or the space's own owner)."""
    if space is None or compiled.spaces[space]["group"] == "identity":
        return None
    owner = compiled.spaces[space]["per"]
    owner_k = None
    for j, (other, _) in enumerate(atoms):
        if j == k:
            continue
        if other == owner and owner is not None:
            owner_k = j
        elif other is not None and compiled.spaces[other]["group"] != "identity":
            return None  # another moving group on the same axis (or the space again): units not comparable alone
    if owner is not None and owner_k is None:
        return None
    return Site(module, side, dim, start, length, tuple(n for _, n in atoms), k, owner_k)


def model_inputs(batch: Any) -> tuple[tuple, dict]:
    """A batch as the model's arguments: a tensor is the input, a dict keyword inputs, a tuple or list
    (inputs, targets, ...) gives its first entry."""
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)) and batch:
        return (batch[0],), {}
    raise TypeError(f"a data batch must be a tensor, a dict of keyword inputs, or (inputs, targets, ...); "
                    f"got {type(batch).__name__}")


def _features(t: torch.Tensor, site: Site, offset: int = 0) -> torch.Tensor:
    """The site's slice of `t` (whose feature axis starts at entry `offset` of the weight's) as (rows, copies,
    n) in float64."""
    start = site.start - offset
    x = t.detach().movedim(site.dim, -1)[..., start:start + site.length]
    x = x.reshape(-1, *site.sizes).double()
    if site.owner is None:
        return x.movedim(1 + site.k, -1).reshape(-1, 1, site.sizes[site.k])
    x = x.movedim((1 + site.owner, 1 + site.k), (-2, -1))
    return x.reshape(-1, site.sizes[site.owner], site.sizes[site.k])


class _Stats:
    """Running sums for one site: means, second moments of each model's units, and the cross moment (per copy,
    or with `pairs` between every two copies: heads that may be permuted)."""

    def __init__(self, pairs: bool = False) -> None:
        self.n = 0
        self.pairs = pairs
        self.sr = self.so = self.srr = self.soo = self.cross = None

    def add(self, r: torch.Tensor, o: torch.Tensor) -> None:
        if r.shape != o.shape:
            raise ValueError(f"the two models' activations differ in shape: {tuple(r.shape)} vs {tuple(o.shape)}")
        cross = torch.einsum("bci,bdj->cdij", r, o) if self.pairs else torch.einsum("bci,bcj->cij", r, o)
        sums = (r.sum(0), o.sum(0), (r * r).sum(0), (o * o).sum(0), cross)
        if self.sr is None:
            self.sr, self.so, self.srr, self.soo, self.cross = sums
        else:
            for name, value in zip(("sr", "so", "srr", "soo", "cross"), sums):
                setattr(self, name, getattr(self, name) + value)
        self.n += r.shape[0]

    def matrix(self, group: str) -> torch.Tensor:
        """Cross-correlation (perm, signed_perm) or cross-covariance (orthogonal), (copies, n, n); with `pairs`
        (copies, copies, n, n), entry [a, b] between reference copy a and other copy b."""
        mr, mo = self.sr / self.n, self.so / self.n
        sd_r = (self.srr / self.n - mr * mr).clamp_min(0).sqrt()
        sd_o = (self.soo / self.n - mo * mo).clamp_min(0).sqrt()
        if self.pairs:  # the reference's copy on the first axis, the other's on the second
            mr, sd_r = mr.unsqueeze(1), sd_r.unsqueeze(1)
        cov = self.cross / self.n - mr.unsqueeze(-1) * mo.unsqueeze(-2)
        if group == "orthogonal":
            return cov
        return cov / (sd_r.unsqueeze(-1) * sd_o.unsqueeze(-2) + 1e-12)


def activation_matching(compiled: CompiledSpec, reference: nn.Module, other: nn.Module,
                        data: Iterable[Any]) -> tuple[dict[str, torch.Tensor], dict[str, list[Site]]]:
    """Elements {space: (copies, n, n)} for the spaces located in the forward pass, and where each was
    found; the spaces not located are absent (weight matching solves them)."""
    batches = iter(data)
    first = next(batches, None)
    if first is None:
        raise ValueError("data holds no batch: activation matching needs inputs to run the models on")
    sites = locate(reference, compiled, _called(reference, first))
    heads = {}  # owners that permute heads -> their per-spaces, all located (else all left to weight matching)
    for owner in compiled.spaces:
        owned = moving_per_spaces(compiled, owner)
        if owned:
            sites.pop(owner, None)  # its element comes from the head pairs
            if all(t in sites for t in owned):
                heads[owner] = owned
            else:
                for t in owned:
                    sites.pop(t, None)
    paired = {t for owned in heads.values() for t in owned}
    stats = {(s, i): _Stats(pairs=s in paired) for s, xs in sites.items() for i in range(len(xs))}
    for batch in itertools.chain([first], batches):
        captured = [_capture(m, sites, batch) for m in (reference, other)]
        for key, st in stats.items():
            st.add(captured[0][key], captured[1][key])
    matrices = {s: sum(stats[(s, i)].matrix(compiled.spaces[s]["group"]) for i in range(len(xs)))
                for s, xs in sites.items()}
    out = {}
    for s in sites:
        if s not in paired:
            c = matrices[s]
            out[s] = torch.stack([solve_linear(compiled.spaces[s]["group"], c[j]) for j in range(c.shape[0])])
    for owner, owned in heads.items():
        n = compiled.spaces[owner]["size"]
        q, rotations, _ = solve_heads(compiled.spaces[owner]["group"], torch.zeros(n, n, dtype=torch.float64),
                                      {t: (compiled.spaces[t]["group"], matrices[t]) for t in owned})
        out[owner] = q.unsqueeze(0)
        out.update(rotations)
    return out, sites


def _called(model: nn.Module, batch: Any) -> set[str]:
    """The modules whose forward runs on `batch` (nn.MultiheadAttention uses its out_proj's weight directly)."""
    called: set[str] = set()
    _forward(model, batch, {name: lambda *_, name=name: called.add(name) for name, _ in model.named_modules()})
    return called


def _capture(model: nn.Module, sites: dict[str, list[Site]], batch: Any) -> dict[tuple[str, int], torch.Tensor]:
    """One forward pass recording every site's features."""
    out: dict[tuple[str, int], torch.Tensor] = {}
    by_module: dict[str, list[tuple[tuple[str, int], Site]]] = {}
    for s, xs in sites.items():
        for i, site in enumerate(xs):
            by_module.setdefault(site.module, []).append(((s, i), site))

    def hook(name: str):
        def record(module, args, kwargs, output):
            for key, site in by_module[name]:
                if site.side == "projection":
                    t, offset = _projection(module, args, kwargs, site)
                    out[key] = _features(t, site, offset)
                else:
                    out[key] = _features(_argument(args, kwargs, 0) if site.side == "input" else output, site)
        return record

    _forward(model, batch, {name: hook(name) for name in by_module})
    return out


def _argument(args: tuple, kwargs: dict, i: int) -> torch.Tensor:
    """A module's i-th input: positional, else by its keyword (Linear's `input`, attention's query, key, value)."""
    if len(args) > i:
        return args[i]
    for k in (("input", "query"), ("key",), ("value",))[i]:
        if k in kwargs:
            return kwargs[k]
    raise ValueError(f"activation matching reads a module's input {i}, but it was called with {len(args)} positional "
                     f"arguments and the keywords {sorted(kwargs)}; use method='weights'")


def _projection(module: nn.MultiheadAttention, args: tuple, kwargs: dict, site: Site) -> tuple[torch.Tensor, int]:
    """q, k, v of an nn.MultiheadAttention, the in-projection of its query, key and value inputs (it calls no
    Linear for them): the thirds of `in_proj_weight`'s rows that the site's slice touches, and where they start."""
    e = module.embed_dim
    thirds = range(site.start // e, (site.start + site.length - 1) // e + 1)
    bias = module.in_proj_bias
    parts = [F.linear(_argument(args, kwargs, j), module.in_proj_weight[j * e:(j + 1) * e],
                      None if bias is None else bias[j * e:(j + 1) * e]) for j in thirds]
    return torch.cat(parts, -1), thirds[0] * e


def _forward(model: nn.Module, batch: Any, hooks: dict[str, Callable[..., None]]) -> None:
    """One forward pass (eval mode, no grad) with forward hooks {module name: hook(module, args, kwargs, output)}."""
    modules = dict(model.named_modules())
    handles = [modules[name].register_forward_hook(h, with_kwargs=True) for name, h in hooks.items()]
    modes = {name: m.training for name, m in model.named_modules()}
    args, kwargs = model_inputs(batch)
    try:
        model.eval()
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
        for name, m in model.named_modules():
            m.training = modes[name]
