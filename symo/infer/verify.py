"""Numerical check of declared spaces: act on the parameters with random group elements and compare the
model's outputs in float64 (docs/theory.md: a true symmetry leaves them at rounding level).

Permutations act by indexing and sign flips by multiplication, so checking a residual stream that
touches a 50k x 768 embedding costs a gather, not a dense product.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch.func import functional_call
from torch.overrides import TorchFunctionMode

from ..compiler import BoundSpec
from .trace import DROPOUT, _tensors, op_name


class NoDropout(TorchFunctionMode):
    """Dropout as the identity, so two forward passes differ only by the parameters. Also notes the
    lowest precision the float64 run is cast to (LLaMA's RMSNorm computes in float32): that sets the
    resolution of the check."""

    def __init__(self) -> None:
        super().__init__()
        self.lowest_eps = 0.0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = op_name(func)
        if name in DROPOUT:
            return args[0] if args else kwargs["input"]
        if name == "scaled_dot_product_attention":
            kwargs = {**kwargs, "dropout_p": 0.0} if len(args) <= 4 else kwargs
            args = tuple(args[:4]) + (0.0,) + tuple(args[5:]) if len(args) > 4 else args
        out = func(*args, **kwargs)
        if any(t.dtype == torch.float64 for t in _tensors((args, kwargs))):
            for t in _tensors(out):
                if t.is_floating_point() and t.dtype != torch.float64:
                    self.lowest_eps = max(self.lowest_eps, torch.finfo(t.dtype).eps)
        return out


def _to64(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(torch.float64) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to64(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _to64(v) for k, v in obj.items()}
    return obj


def sample_element(spaces: Mapping[str, tuple[str, int, int]], generator: torch.Generator) -> dict[str, tuple]:
    """space -> ("perm", index (copies, n), signs (copies, n) or None) or ("orth", Q (copies, n, n)).
    `spaces` maps a name to (group, size, copies); copies > 1 for a `per` space (one element per owner index)."""
    out = {}
    for name, (group, n, copies) in spaces.items():
        if group == "identity":
            continue
        if group == "orthogonal":
            q, r = torch.linalg.qr(torch.randn(copies, n, n, generator=generator, dtype=torch.float64))
            out[name] = ("orth", q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2))
        else:  # never the identity, and a signed element flips at least one sign: the subgroups a relaxed
            # space most often keeps (nothing, or the plain permutations) cannot pass the check by chance
            idx = torch.stack([_moving_perm(n, generator) for _ in range(copies)])
            signs = None
            if group == "signed_perm":
                signs = (torch.randint(0, 2, (copies, n), generator=generator) * 2 - 1).to(torch.float64)
                signs[torch.arange(copies), torch.randint(0, n, (copies,), generator=generator)] = -1.0
            out[name] = ("perm", idx, signs)
    return out


def _moving_perm(n: int, generator: torch.Generator) -> torch.Tensor:
    for _ in range(16):
        idx = torch.randperm(n, generator=generator)
        if n < 2 or not torch.equal(idx, torch.arange(n)):
            return idx
    return torch.roll(torch.arange(n), 1)


def element_matrices(element: Mapping[str, tuple]) -> dict[str, torch.Tensor]:
    """The same element as CompiledSpec.random_element writes it: (copies, n, n) matrices."""
    out = {}
    for name, action in element.items():
        if action[0] == "orth":
            out[name] = action[1]
        else:
            idx, signs = action[1], action[2]
            eye = torch.eye(idx.shape[1], dtype=torch.float64)
            m = torch.stack([eye[i] for i in idx])
            out[name] = m * signs.unsqueeze(-1) if signs is not None else m
    return out


class Workspace:
    """The float64 parameters the check runs on, moved in place and put back from the model's own tensors.

    A float64 GPT-2 124M is 1 GB, and the first touch of fresh memory costs more than the group action itself:
    so the float64 copy is made once, A_g w is written into it from the untouched originals (`source`, whose
    conversion to float64 is exact), and a tensor moved by one element but not the next is copied back from its
    original. Scratch buffers (one flat buffer per role, grown on demand) carry the steps in between."""

    def __init__(self, source: Mapping[str, torch.Tensor]) -> None:
        self.source = dict(source)
        self.work = {n: t.to(torch.float64, copy=True) if t.is_floating_point() else t for n, t in self.source.items()}
        self.dirty: set[str] = set()
        self.scratch: list[torch.Tensor | None] = [None, None, None]

    def step(self, i: int, shape: list[int]) -> torch.Tensor:
        numel = math.prod(shape)
        buf = self.scratch[i]
        ref = next(iter(self.work.values()))
        if buf is None or buf.numel() < numel:
            buf = self.scratch[i] = torch.empty(numel, dtype=torch.float64, device=ref.device)
        return buf[:numel].view(shape)


def _apply(x: torch.Tensor, action: tuple, k: int, j: int | None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Act along atom k; j is the owner atom for a per-owner element (one element per owner index).
    `out` (contiguous, x's shape, not x) receives the result when given; permutations then allocate nothing."""
    action = tuple(a.to(x.device) if isinstance(a, torch.Tensor) else a for a in action)  # sampled on the CPU
    if j is None and action[0] == "perm":
        idx, signs = action[1][0], action[2]
        shape = [1] * x.dim()
        shape[k] = -1
        if k == 0:
            x = torch.index_select(x, 0, idx, out=out) if out is not None else x.index_select(0, idx)
        else:  # gather reads rows contiguously; index_select along an inner axis is several times slower
            index = idx.view(shape).expand(x.shape)
            x = torch.gather(x, k, index, out=out) if out is not None else torch.gather(x, k, index)
        if signs is not None:
            x.mul_(signs[0].to(x.dtype).view(shape))
        return x
    y = _apply_alloc(x, action, k, j)
    return out.copy_(y) if out is not None else y


def _apply_alloc(x: torch.Tensor, action: tuple, k: int, j: int | None) -> torch.Tensor:
    if j is None:  # orthogonal
        return torch.movedim(torch.tensordot(action[1][0].to(x.dtype), x, dims=([1], [k])), 0, k)
    x = torch.movedim(x, (j, k), (0, 1))
    shape = x.shape
    if action[0] == "orth":
        y = torch.bmm(action[1].to(x.dtype), x.reshape(shape[0], shape[1], -1)).reshape(shape)
    else:
        idx, signs = action[1], action[2]
        y = x[torch.arange(shape[0]).unsqueeze(1), idx]
        if signs is not None:
            y = y * signs.to(x.dtype).view(shape[0], shape[1], *([1] * (x.dim() - 2)))
    return torch.movedim(y, (0, 1), (j, k))


def act(bound: BoundSpec, element: Mapping[str, tuple], params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A_g w for an element on some of the spaces (the others act as the identity)."""
    out = dict(params)
    for p in bound.params:
        blocks = [b for b in p.blocks if any(a.space in element for a in b.atoms)]
        if blocks:
            out[p.name] = _act_blocks(bound, element, p, blocks, params[p.name].clone())
    return out


def act_in_place(bound: BoundSpec, element: Mapping[str, tuple], ws: Workspace) -> dict[str, torch.Tensor]:
    """`act` on the workspace's float64 parameters, computed from the originals into memory that is already
    mapped: a permutation costs one gather and allocates nothing. Returns ws.work (valid until the next call)."""
    touched = {p.name: [b for b in p.blocks if any(a.space in element for a in b.atoms)] for p in bound.params}
    touched = {n: blocks for n, blocks in touched.items() if blocks}
    for name in ws.dirty - set(touched):
        ws.work[name].copy_(ws.source[name])
    ws.dirty = set(touched)
    for p in bound.params:
        if p.name not in touched:
            continue
        src, dst = ws.source[p.name], ws.work[p.name]
        if len(p.blocks) == 1 and all(n == length for n, (_, length) in zip(src.shape, p.blocks[0].slices)):
            b = p.blocks[0]  # the whole tensor is one block
            sizes = [a.size for a in b.atoms]
            x = src.reshape(sizes) if src.dtype == torch.float64 else ws.step(2, sizes).copy_(src.reshape(sizes))
            moving = _owners_first(bound, b, [k for k, atom in enumerate(b.atoms) if atom.space in element])
            for step, k in enumerate(moving):  # the last step writes the result, the others alternate scratch
                dest = dst.view(sizes) if step == len(moving) - 1 else ws.step(step % 2, sizes)
                x = _apply(x, element[b.atoms[k].space], k, _owner_axis(bound, b, k), out=dest)
            continue
        _act_blocks(bound, element, p, touched[p.name], dst.copy_(src))
    return ws.work


def _owners_first(bound: BoundSpec, block, ks: list[int]) -> list[int]:
    """Atoms `ks` in the order CompiledSpec.act applies them: owners (a perm owner moves heads as wholes)
    before their per-spaces, whose element i then acts at the result's index i."""
    return sorted(ks, key=lambda k: bound.spaces[block.atoms[k].space].per is not None)


def _owner_axis(bound: BoundSpec, block, k: int) -> int | None:
    owner = bound.spaces[block.atoms[k].space].per
    return next(i for i, a in enumerate(block.atoms) if a.space == owner) if owner else None


def _act_blocks(bound: BoundSpec, element: Mapping[str, tuple], p, blocks: list, new: torch.Tensor) -> torch.Tensor:
    """Act on `new` (a float64 copy of the original tensor) block by block, in place."""
    for b in blocks:
        target = new
        for axis, (start, length) in enumerate(b.slices):
            target = target.narrow(axis, start, length)
        x = target.reshape([a.size for a in b.atoms])
        # each step returns a fresh tensor, so reading `target` is safe
        for k in _owners_first(bound, b, [k for k, atom in enumerate(b.atoms) if atom.space in element]):
            x = _apply(x, element[b.atoms[k].space], k, _owner_axis(bound, b, k))
        target.copy_(x.reshape(target.shape))
    return new


class OutputCheck:
    """The model in float64 at fixed inputs: relative output change under a group element."""

    def __init__(self, model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.model = model
        self.workspace = Workspace({n: p.detach() for n, p in model.named_parameters()})
        self.params = self.workspace.work  # float64; equal to the model's parameters except during a trial
        self.buffers = {n: _to64(b).clone() for n, b in model.named_buffers()}
        self.args, self.kwargs = _to64(tuple(args)), _to64(dict(kwargs))
        self.forwards = 0
        self.lowest_eps = 0.0
        self.base = self.run(self.params)
        self.base_norm = float(self.base.norm())

    def tolerance(self, tol: float) -> float:
        """`tol`, or 100 eps of the lowest precision the model casts to inside, if that is larger."""
        return max(tol, 100 * self.lowest_eps)

    def note(self) -> str | None:
        if not self.lowest_eps:
            return None
        return (f"the model casts part of its float64 forward pass to a lower precision (eps {self.lowest_eps:.1e}, "
                f"e.g. an RMSNorm computed in float32): the check's tolerance is {self.tolerance(0):.1e}")

    def run(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self.forwards += 1
        mode = NoDropout()
        with torch.no_grad(), mode:
            out = functional_call(self.model, {**params, **self.buffers}, self.args, self.kwargs, strict=False)
        self.lowest_eps = max(self.lowest_eps, mode.lowest_eps)
        flat = [t.reshape(-1).to(torch.float64) for t in _tensors(out) if t.is_floating_point()]
        if not flat:
            raise ValueError("the model returned no floating-point tensor to compare")
        return torch.cat(flat)

    def rel_change(self, bound: BoundSpec, groups: Mapping[str, str], *, trials: int = 2,
                   generator: torch.Generator | None = None) -> float:
        """max over trials of |f(A_g w) - f(w)| / |f(w)|, g random on the spaces in `groups` (name -> group)."""
        gen = generator or torch.Generator().manual_seed(0)
        spaces = {}
        for name, group in groups.items():
            sp = bound.spaces[name]
            copies = bound.spaces[sp.per].size if sp.per else 1
            spaces[name] = (group, sp.size, copies)
        worst = 0.0
        for _ in range(trials):
            element = sample_element(spaces, gen)
            if not element:
                return 0.0
            moved = self.run(act_in_place(bound, element, self.workspace))
            worst = max(worst, float((moved - self.base).norm()) / max(self.base_norm, 1e-300))
        return worst
