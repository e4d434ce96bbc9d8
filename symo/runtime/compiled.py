"""`CompiledSpec`: the runtime face of a compiled spec. The optimizer sees only this object."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..compiler import GeneratedModule, Spec, compile_spec, load_spec
from . import describe as reports
from .curvature import Curvature

Tensors = Mapping[str, torch.Tensor]


class NonFiniteGradientError(ValueError):
    """A gradient holds NaN or inf; the message names the parameter."""


class NonFiniteUpdateError(FloatingPointError):
    """The optimizer itself produced NaN or inf from finite gradients; the message names the block or
    parameter and the backend, so it is not mistaken for a bad gradient."""


@dataclass(frozen=True)
class BlockInfo:
    """One isotypic block: Y has shape (batch, mult, width) and S = (Y Y^T / dim) (x) I."""

    id: str
    name: str
    batch: int
    mult: int
    width: int
    dim: int
    dim_expr: str
    params: tuple[str, ...]

    @property
    def root_form(self) -> bool:
        """A single gradient's factor has rank <= width, so store Y / sqrt(d) when width <= mult
        (for a square block the root costs the same memory and keeps the gradient's own precision)."""
        return self.width <= self.mult


class CompiledSpec:
    """A spec compiled for one set of parameter shapes."""

    def __init__(self, module: GeneratedModule) -> None:
        ns, bound = module.namespace, module.bound
        self.key = module.key  # the generated source's key: spec + layout, shared by every width
        self.sizes: dict[str, int] = bound.sizes  # what this instance bound the source's symbols to
        self.source = module.source
        self.source_path: Path | None = module.path
        self.from_cache = module.from_cache
        self.name: str = bound.name
        self.spec_file: str = bound.source
        self.shapes: dict[str, tuple[int, ...]] = {p.name: tuple(p.shape) for p in bound.params}
        self.param_names: list[str] = list(self.shapes)
        self.uncovered: dict[str, tuple[int, ...]] = {n: tuple(s) for n, s in bound.uncovered}
        self.spaces: dict[str, dict] = {s: {"group": sp.group, "size": sp.size, "per": sp.per}
                                        for s, sp in bound.spaces.items()}
        self.blocks: list[BlockInfo] = [
            BlockInfo(b["id"], b["name"], b["batch"], b["mult"], b["width"], b["dim"], b["dim_expr"],
                      tuple(dict.fromkeys(r["param"] for r in b["rows"])))
            for b in ns["BLOCKS"]]
        self.block_ids = [b.id for b in self.blocks]
        self._bound = bound
        self._gather = ns["gather"]
        self._scatter = ns["scatter"]
        self._trivial = [b.id for b in self.blocks if b.name == "trivial"]

    @functools.cached_property
    def couplings(self) -> list[tuple[list[str], list[str]]]:
        """Which parameters the group couples, as (spaces, parameters) pairs (BoundSpec.couplings)."""
        return self._bound.couplings()

    @functools.cached_property
    def _block_params(self) -> dict[str, list[dict]]:
        return {p.name: [{"slices": b.slices, "atoms": [(a.space, a.size) for a in b.atoms],
                          "axes": [[(a.space, a.size) for a in axis] for axis in b.axes]}
                         for b in p.blocks] for p in self._bound.params}

    @functools.cached_property
    def space_params(self) -> dict[str, list[str]]:
        """space -> the covered parameters it acts on (an axis of one of their blocks), in the model's order."""
        return {s: [n for n, bs in self._block_params.items() if any(sp == s for b in bs for sp, _ in b["atoms"])]
                for s in self.spaces}

    @functools.cached_property
    def repeated_spaces(self) -> dict[str, list[str]]:
        """space -> the covered parameters with a block in which it acts on two axes (docs/repeated_spaces.md)."""
        out: dict[str, list[str]] = {}
        for name, blocks in self._block_params.items():
            twice = set()
            for b in blocks:
                on_axes = [sp for axis in b["axes"] for sp in {s for s, _ in axis if s is not None}]
                twice |= {sp for sp in on_axes if on_axes.count(sp) > 1}
            for sp in sorted(twice):
                out.setdefault(sp, []).append(name)
        return out

    def axis_spaces(self, name: str, axis: int) -> set[str]:
        """The spaces that act on axis `axis` of covered parameter `name` (in any of its blocks; free axes none)."""
        return {sp for b in self._block_params[name] for sp, _ in b["axes"][axis] if sp is not None}

    # ------------------------------------------------------------ coordinates
    def gather(self, tensors: Tensors) -> dict[str, torch.Tensor]:
        """{param: tensor} -> {block id: Y (batch, mult, width)}: the isotypic coordinates."""
        if not isinstance(tensors, Mapping):
            raise TypeError(f"expected a dict {{parameter name: tensor}}, got {type(tensors).__name__}")
        missing = [n for n in self.param_names if n not in tensors]
        if missing:
            raise KeyError(f"missing tensors for covered parameters {missing[:5]}"
                           + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
        for n in self.param_names:
            t = tensors[n]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"tensors[{n!r}] must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != self.shapes[n]:
                raise ValueError(f"tensors[{n!r}] has shape {tuple(t.shape)}, but the spec was compiled for "
                                 f"{self.shapes[n]}; compile it for this model's shapes")
        return self._gather(tensors)

    def scatter(self, ys: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The transpose of `gather`: block coordinates -> {param: tensor}."""
        return self._scatter(ys)

    # ------------------------------------------------------------ estimators
    def orbit_average(self, grads: Tensors, *, centered: bool = False, check_finite: bool = True) -> Curvature:
        """S_g = E_g[A_g g g^T A_g^T] (docs/theory.md) from one gradient dict, in factored form.

        `centered=True` averages (g - R1(g)) instead: the invariant part is dropped, so the result is
        singular on parameters no group moves and must not be an optimizer's only curvature there.
        """
        if check_finite:
            check_finite_tensors(grads, self.param_names)
        ys = self.gather(grads)
        dense, roots = {}, {}
        for b in self.blocks:
            y = ys[b.id]
            if centered and b.id in self._trivial:
                continue
            d = max(b.dim, 1)
            if b.root_form:
                roots[b.id] = y / math.sqrt(d)
            else:
                dense[b.id] = (y @ y.transpose(-1, -2)) / d
        return Curvature(self, dense, roots)

    def invariant_part(self, v: Tensors) -> dict[str, torch.Tensor]:
        """R1(v) = E_g[A_g v]: the projection onto vectors every group element fixes."""
        ys = self.gather(v)
        return self.scatter({b: (y if b in self._trivial else torch.zeros_like(y)) for b, y in ys.items()})

    def zeros(self) -> Curvature:
        """The zero element (no stored factors): the start of an EMA."""
        return Curvature(self)

    # ------------------------------------------------------------ the group
    def random_element(self, generator: torch.Generator | None = None,
                       dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        """A random group element: one orthogonal matrix per space, as (1, n, n), or (owner's size, n, n) for a
        `per` space (under a perm owner this is a uniform element of the wreath product: the heads' permutation
        and an independent element per head)."""
        out = {}
        for s, info in self.spaces.items():
            copies = self.spaces[info["per"]]["size"] if info["per"] else 1
            out[s] = torch.stack([_random_matrix(info["group"], info["size"], generator, dtype)
                                  for _ in range(copies)])
        return out

    def act(self, element: Mapping[str, torch.Tensor], tensors: Tensors,
            names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """A_g w: transform every covered parameter by the group element (uncovered ones pass through).
        `names`: transform only these covered parameters (`tensors` needs only them).

        Owners act before their per-spaces, whatever the atoms' order: with a perm owner (heads permuted as
        wholes) a block's head slot i receives head pi(i) rotated by the per-space's element i,
        x'_i = Q_i x_pi(i), in every parameter alike."""
        out = dict(tensors)
        for name in self._block_params if names is None else names:
            blocks, t = self._block_params[name], tensors[name]
            new = t.clone()
            for b in blocks:
                view = t
                for axis, (start, length) in enumerate(b["slices"]):
                    view = view.narrow(axis, start, length)
                atoms = b["atoms"]
                x = view.reshape([n for _, n in atoms])
                order = sorted(range(len(atoms)), key=lambda k: atoms[k][0] is not None
                               and self.spaces[atoms[k][0]]["per"] is not None)
                for k in order:
                    space = atoms[k][0]
                    if space is None or self.spaces[space]["group"] == "identity":
                        continue
                    q = element[space].to(device=x.device, dtype=x.dtype)  # elements are sampled on the CPU
                    owner = self.spaces[space]["per"]
                    if owner is None:
                        x = _act_axis(q[0], x, k)
                    else:  # one matrix per index of the owner atom
                        j = next(i for i, (s, _) in enumerate(atoms) if s == owner)
                        x = _act_per(x, q, k, j)
                target = new
                for axis, (start, length) in enumerate(b["slices"]):
                    target = target.narrow(axis, start, length)
                target.copy_(x.reshape(target.shape))
            out[name] = new
        return out

    def param_blocks(self, name: str) -> list[dict]:
        """The blocks of covered parameter `name`: per block, `slices` ((start, length) on each tensor axis)
        and `axes` (for each tensor axis, the atoms (space or None, size) it splits into, row-major)."""
        return [{"slices": b["slices"], "axes": b["axes"]} for b in self._block_params[name]]

    # ------------------------------------------------------------ reports (symo/runtime/describe.py)
    def memory(self) -> dict[str, int]:
        """Numbers stored: EMA factors, single-gradient roots, dense P x P, and Shampoo's factors."""
        return reports.memory(self)

    def describe(self) -> str:
        """A human-readable report of the blocks, memory and uncovered parameters (the CLI prints it)."""
        return reports.describe(self)

    def same_binding(self, other: CompiledSpec) -> bool:
        """Same source and same sizes: curvatures of the two can be added."""
        return self is other or (self.key == other.key and self.sizes == other.sizes
                                 and self.param_names == other.param_names)

    def __repr__(self) -> str:
        return f"CompiledSpec({self.name!r}, params={len(self.param_names)}, blocks={len(self.blocks)})"


def check_finite_tensors(tensors: Tensors, names: list[str]) -> None:
    """Raise NonFiniteGradientError naming the first parameter with NaN/inf (one sync on success)."""
    present = [n for n in names if n in tensors and tensors[n].numel() > 0]
    if not present:
        return
    values = [tensors[n].detach() for n in present]
    # A sum is NaN or inf when an entry is, and runs at memory speed; isfinite().all() per tensor (and
    # a NaN-aware max) cost 5% of a Muon-sized step on CPU. A finite tensor whose sum
    # overflows only sends the check on to the exact per-tensor test.
    if bool(torch.isfinite(torch.stack([v.sum() for v in values])).all()):
        return
    finite = torch.stack([torch.isfinite(v).all() for v in values])
    if bool(finite.all()):
        return
    bad = present[int((~finite).nonzero()[0])]
    raise NonFiniteGradientError(
        f"gradient of parameter {bad!r} holds NaN or inf: either the input batch holds NaN or inf (check the "
        "data, e.g. torch.isfinite(x).all()), or the training diverged (lower the learning rate, enable gradient "
        "clipping, or check the loss for overflow)")


def _random_matrix(group: str, n: int, generator, dtype) -> torch.Tensor:
    if group == "identity":
        return torch.eye(n, dtype=dtype)
    if group == "orthogonal":  # Haar: QR of a Gaussian with the sign of diag(R) fixed
        q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=dtype))
        return q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    m = torch.eye(n, dtype=dtype)[torch.randperm(n, generator=generator)]
    if group == "signed_perm":
        m = m * (torch.randint(0, 2, (n, 1), generator=generator) * 2 - 1).to(dtype)
    return m


def _act_axis(q: torch.Tensor, x: torch.Tensor, k: int) -> torch.Tensor:
    """x'_i = sum_j q_ij x_j along axis k. A (signed) permutation matrix that needs no gradient is applied by
    indexing, exactly and in O(size of x) instead of a dense product (a 3072-unit MLP space of GPT-2)."""
    n = q.shape[0]
    if not q.requires_grad and int(torch.count_nonzero(q)) == n:
        index = q.abs().argmax(-1)
        values = q.gather(1, index.unsqueeze(1)).squeeze(1)
        # n nonzeros, one at (i, index_i) in every row and column: q is a permutation times a diagonal
        if bool((values != 0).all()) and bool((torch.bincount(index, minlength=n) == 1).all()):
            y = x.index_select(k, index)
            if not bool((values == 1).all()):
                y = y * values.to(y.dtype).reshape([-1 if a == k else 1 for a in range(x.dim())])
            return y
    return torch.movedim(torch.tensordot(q, x, dims=([1], [k])), 0, k)


def _act_per(x: torch.Tensor, q: torch.Tensor, k: int, j: int) -> torch.Tensor:
    """Apply q[i] along atom k of the slice where atom j (the owner) equals i."""
    x = torch.movedim(x, (j, k), (0, 1))  # (owner, n, rest...)
    shape = x.shape
    y = torch.bmm(q, x.reshape(shape[0], shape[1], -1)).reshape(shape)
    return torch.movedim(y, (0, 1), (j, k))


def compile(spec: Spec | str | Path, shapes: Any, *, sizes: dict[str, int] | None = None,
            cache_dir: str | Path | None = None, disk_cache: bool = True, strict: bool = True) -> CompiledSpec:
    """Compile a spec (a `Spec`, or a path to a spec file) for `shapes` ({name: shape} or an nn.Module).

    `sizes` supplies space sizes the shapes cannot decide, e.g. {"head{i}": 4} for n_head.
    `strict=False` compiles the spec for a subset of the parameters it was written for (fine-tuning
    part of a model): rules that match no parameter are dropped, with the spaces and blocks that
    then have none; with `strict=True` such a rule is a SpecError.
    The generated code is cached in memory and on disk (see README, "Kernel cache"); a second call
    with the same spec and shapes costs a parse and a hash.
    """
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"compile: cache_dir must be a path, got {type(cache_dir).__name__}")
    if not isinstance(disk_cache, bool):
        raise TypeError(f"compile: disk_cache must be True or False, got {disk_cache!r}")
    if isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    elif not isinstance(spec, Spec):
        raise TypeError(f"compile: spec must be a Spec, a path or a bundled spec name (e.g. 'gpt_muon'), "
                        f"got {type(spec).__name__}")
    if not isinstance(strict, bool):
        raise TypeError(f"compile: strict must be True or False, got {strict!r}")
    return CompiledSpec(compile_spec(spec, shapes, sizes=sizes, cache_dir=cache_dir, disk_cache=disk_cache,
                                     strict=strict))


def compile_for(spec: Any, shapes: dict[str, tuple[int, ...]], sizes: dict[str, int] | None,
                strict: bool = True) -> CompiledSpec:
    """`spec` compiled for `shapes`; a CompiledSpec is taken as it is, after a check that it was compiled for
    these shapes (what the optimizer and the equivariance checker take as their spec argument)."""
    if isinstance(spec, CompiledSpec):
        bad = {n: (s, shapes.get(n)) for n, s in spec.shapes.items() if shapes.get(n, s) != s}
        if bad:
            raise ValueError(f"the CompiledSpec was compiled for other shapes: {bad} (compiled, given)")
        return spec
    return compile(spec, shapes, sizes=sizes, strict=strict)
