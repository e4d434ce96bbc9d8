"""Symo on several processes: the distributed plan made at construction, and the `Distributor` that moves
each coupling component's tensors to its owner rank and the updates back (docs/distributed.md).

A coupling component is a set of blocks (over every stage) closed under sharing a parameter: a perm MLP
space couples c_fc rows, its bias and c_proj columns, so those three travel together. Each component
gets one owner rank, balanced by a modelled cost; the owner alone gathers the component's coordinates,
computes its matrix functions and keeps its statistics. Per step and per dtype:

    momentum on the local tensors -> exchange in (each component's shards to its owner)
    -> the owner's unchanged gather -> matrix function -> scatter on plain tensors
    -> exchange out (each rank receives its shard, or the whole tensor, of every update)

Both exchanges are one all-to-all per dtype and bucket (uneven splits), whatever the number of
parameters; the replicated mode's way in, with nothing to move, is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from ..runtime.compiled import NonFiniteGradientError, check_finite_tensors
from .config import DistributedConfig
from .plan import Stage

Tensors = dict[str, torch.Tensor]
COMM_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Component:
    """Blocks that share parameters, with those parameters, computed on one rank."""

    params: tuple[str, ...]
    """In the spec's order."""
    blocks: tuple[tuple[int, str], ...]
    """(stage index, block id) pairs."""
    cost: float
    owner: int
    anchor: str
    """The parameter whose optimizer state holds the blocks' statistics: the first that requires a
    gradient (torch.distributed.checkpoint loads no state into a frozen parameter)."""


def coupling_components(stages: list[Stage]) -> list[tuple[tuple[str, ...], tuple[tuple[int, str], ...]]]:
    """The connected components of blocks linked by a shared parameter, over every stage, in the
    order of their first parameter in the spec (deterministic on every rank)."""
    order = list(stages[0].compiled.param_names)
    parent = {n: n for n in order}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for stage in stages:
        for b in stage.compiled.blocks:
            for other in b.params[1:]:
                a, c = root(b.params[0]), root(other)
                if a != c:
                    parent[max(a, c, key=order.index)] = min(a, c, key=order.index)
    members: dict[str, list[str]] = {}
    for n in order:
        members.setdefault(root(n), []).append(n)
    blocks: dict[str, list[tuple[int, str]]] = {r: [] for r in members}
    for k, stage in enumerate(stages):
        for b in stage.compiled.blocks:
            if b.params:
                blocks[root(b.params[0])].append((k, b.id))
    return [(tuple(ps), tuple(blocks[r])) for r, ps in members.items()]


def component_cost(stages: list[Stage], blocks: tuple[tuple[int, str], ...], params: tuple[str, ...]) -> float:
    """Modelled cost: the matrix functions (batch mult^2 (mult + width) per block, an eigh or a
    Newton–Schulz step on a mult x width Y) plus the gather, scatter and exchanges (the entries)."""
    info = {(k, b.id): b for k, st in enumerate(stages) for b in st.compiled.blocks}
    shapes = stages[0].compiled.shapes
    flops = sum(b.batch * b.mult * b.mult * (b.mult + b.width) for b in (info[x] for x in blocks))
    return float(flops + 4 * sum(math.prod(shapes[n]) for n in params))


def assign_owners(costs: list[float], world: int) -> list[int]:
    """Longest-processing-time first: each component, costliest first, to the least loaded rank."""
    load = [0.0] * world
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += costs[i]
    return owner


def resolve_mode(cfg: DistributedConfig, params: Mapping[str, torch.Tensor]) -> str:
    """DistributedConfig.mode -> "off", "replicated" or "fsdp" for these parameters. "off" on DTensors is
    the implicit path: every rank runs the whole step on DTensors, which redistribute as each operation
    needs (all-reduced Grams or all-gathered tensors, every matrix function on every rank)."""
    sharded = [n for n, p in params.items() if isinstance(p, DTensor)]
    mode = cfg.mode
    if mode == "auto":
        mode = "fsdp" if sharded else "off"
    if mode == "replicated" and sharded:
        raise ValueError(f"distributed_mode='replicated' takes whole parameters (DDP), got DTensors {sharded[:3]}; "
                         "use 'fsdp' or 'auto'")
    return mode


@dataclass
class Distributor:
    """The exchange of both modes: per parameter a row layout (rows per rank on dim 0, or None for a whole
    tensor on every rank), one all-to-all per dtype and bucket each way. "replicated" (DDP): whole parameters
    and the same gradients everywhere, nothing travels in, each owner's updates travel out whole. "fsdp"
    (FSDP2): DTensor parameters sharded on dim 0 of a 1-D mesh (torch.chunk's uneven rows); a replicated
    DTensor or a plain tensor counts as whole on every rank. The step calls `to_owners` before its block loop
    and `from_owners` after it."""

    mode: str
    components: list[Component]
    shapes: dict[str, tuple[int, ...]]
    rows: dict[str, list[int] | None]
    rank: int
    world: int
    group: Any
    comm_dtype: torch.dtype | None
    bucket_bytes: int
    owner: dict[str, int] = field(init=False)
    owned: list[set[str]] = field(init=False)
    counters: dict[str, int] = field(default_factory=lambda: {"collectives": 0, "bytes": 0})

    def __post_init__(self) -> None:
        self.owner = {n: c.owner for c in self.components for n in c.params}
        n_stages = 1 + max((k for c in self.components for k, _ in c.blocks), default=0)
        self.owned = [set() for _ in range(n_stages)]
        for c in self.components:
            if c.owner == self.rank:
                for k, bid in c.blocks:
                    self.owned[k].add(bid)

    def local(self, t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    def check_finite(self, grads: Tensors) -> None:
        local = {n: self.local(g) for n, g in grads.items()}
        if not local:  # no gradient anywhere (the same parameters have gradients on every rank)
            return
        error = None
        try:
            check_finite_tensors(local, list(local))
        except NonFiniteGradientError as e:
            error = e
        if self.mode == "replicated" or self.world == 1:  # the same gradients on every rank
            if error is not None:
                raise error
            return
        flag = torch.tensor([0.0 if error is None else 1.0], device=next(iter(local.values())).device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        self.counters["collectives"] += 1
        if error is not None:
            raise error
        if flag.item() > 0:
            raise NonFiniteGradientError("a gradient holds NaN or inf on another rank (its message names the "
                                         "parameter); lower the learning rate or enable gradient clipping")

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks (one all-reduce; `t` itself on one rank)."""
        if self.world > 1:
            dist.all_reduce(t, group=self.group)
            self.counters["collectives"] += 1
        return t

    # ---------------------------------------------------------------- sizes
    def _row_numel(self, n: str) -> int:
        return math.prod(self.shapes[n][1:])

    def _piece(self, n: str, r: int) -> int:
        """Entries of parameter n rank r holds."""
        rows = self.rows[n]
        return math.prod(self.shapes[n]) if rows is None else rows[r] * self._row_numel(n)

    def _buckets(self, names: list[str], dtypes: dict[str, torch.dtype]) -> list[list[str]]:
        """Present parameters grouped by the dtype they travel in, then cut at bucket_bytes."""
        by_dtype: dict[torch.dtype, list[str]] = {}
        for n in names:
            by_dtype.setdefault(dtypes[n], []).append(n)
        out = []
        for dt, ns in by_dtype.items():
            size = torch.empty((), dtype=dt).element_size()
            bucket, used = [], 0
            for n in ns:
                b = math.prod(self.shapes[n]) * size
                if bucket and used + b > self.bucket_bytes:
                    out.append(bucket)
                    bucket, used = [], 0
                bucket.append(n)
                used += b
            out.append(bucket)
        return out

    def _all_to_all(self, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
        recv = send.new_empty(sum(recv_sizes))
        if self.world == 1:
            return send.clone()
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=self.group)
        self.counters["collectives"] += 1
        self.counters["bytes"] += (sum(send_sizes) - send_sizes[self.rank]) * send.element_size()
        return recv

    def _travel_dtype(self, t: torch.Tensor) -> torch.dtype:
        return self.comm_dtype or t.dtype

    # ---------------------------------------------------------------- the two exchanges
    def to_owners(self, names: list[str], local: Tensors) -> Tensors:
        """Local tensors of `names` -> the full tensors of the ones this rank owns."""
        full: Tensors = {}
        moving = [n for n in names if self.rows[n] is not None]
        for n in names:
            if self.rows[n] is None and self.owner[n] == self.rank:
                full[n] = local[n]
        if not moving:
            return full
        dtypes = {n: self._travel_dtype(local[n]) for n in moving}
        for bucket in self._buckets(moving, dtypes):
            dt = dtypes[bucket[0]]
            send_sizes = [sum(self._piece(n, self.rank) for n in bucket if self.owner[n] == r)
                          for r in range(self.world)]
            parts = [local[n].reshape(-1).to(dt) for r in range(self.world) for n in bucket if self.owner[n] == r]
            send = torch.cat(parts) if parts else local[bucket[0]].new_empty(0, dtype=dt)
            mine = [n for n in bucket if self.owner[n] == self.rank]
            recv_sizes = [sum(self._piece(n, s) for n in mine) for s in range(self.world)]
            recv = self._all_to_all(send, send_sizes, recv_sizes)
            pieces = recv.split(recv_sizes)
            cuts = [piece.split([self._piece(n, s) for n in mine]) for s, piece in enumerate(pieces)]
            for j, n in enumerate(mine):
                row = self.shapes[n][1:]
                whole = torch.cat([cuts[s][j].reshape(-1, *row) for s in range(self.world)])
                full[n] = whole.reshape(self.shapes[n]).to(local[n].dtype)
        return full

    def from_owners(self, names: list[str], updates: Tensors, like: Tensors) -> Tensors:
        """Full updates of the owned parameters -> this rank's part of every present parameter's update."""
        out: Tensors = {}
        dtypes = {n: self._travel_dtype(like[n]) for n in names}
        for bucket in self._buckets(names, dtypes):
            dt = dtypes[bucket[0]]
            mine = [n for n in bucket if self.owner[n] == self.rank]
            for n in mine:  # a whole tensor's owner keeps its own copy
                if self.rows[n] is None:
                    out[n] = updates[n].to(like[n].dtype)
            if self.world == 1:
                out.update({n: updates[n].to(like[n].dtype) for n in mine})
                continue
            parts, send_sizes = [], []
            for r in range(self.world):
                pieces = [self._outgoing(n, updates[n].to(dt), r) for n in mine]
                parts += pieces
                send_sizes.append(sum(x.numel() for x in pieces))
            # what comes from rank s: my part of each parameter s owns (nothing of my own whole tensors)
            incoming = [[n for n in bucket if self.owner[n] == s and not (self.rows[n] is None and s == self.rank)]
                        for s in range(self.world)]
            recv_sizes = [sum(self._piece(n, self.rank) for n in ns) for ns in incoming]
            send = torch.cat(parts) if parts else like[bucket[0]].new_empty(0, dtype=dt)
            recv = self._all_to_all(send, send_sizes, recv_sizes)
            for ns, piece in zip(incoming, recv.split(recv_sizes)):
                for n, x in zip(ns, piece.split([self._piece(n, self.rank) for n in ns])):
                    out[n] = x.reshape(like[n].shape).to(like[n].dtype)
        return out

    def _outgoing(self, n: str, u: torch.Tensor, r: int) -> torch.Tensor:
        """The part of owned update u that rank r receives (flat)."""
        rows = self.rows[n]
        if rows is None:
            return u.reshape(-1) if r != self.rank else u.new_empty(0)
        return u.narrow(0, sum(rows[:r]), rows[r]).reshape(-1)


def distribute(cfg: DistributedConfig, kind: Any, stages: list[Stage], params: Mapping[str, torch.Tensor]
               ) -> tuple[Distributor | None, dict[tuple[int, str], torch.Tensor]]:
    """The distributor for these parameters (None in one process or with nothing covered) and each block's
    anchor parameter: a block's statistics live in the state of its component's anchor parameter (with
    several processes on the owner only), so torch.distributed.checkpoint, which maps parameter-keyed
    state to names, saves and restores them."""
    mode = resolve_mode(cfg, params)
    anchors = {(k, bid): params[anchor(ps, params)] for ps, blocks in coupling_components(stages) for k, bid in blocks}
    if mode == "off" or not stages[0].compiled.param_names:
        return None, anchors
    if kind.needs_weights:
        raise NotImplementedError(f"the {kind.name} preconditioner reads the whole weights; it is not distributed "
                                  "yet (distributed_mode='off' for one process)")
    return make_distributor(cfg, stages, params, mode), anchors


def anchor(names: tuple[str, ...], params: Mapping[str, torch.Tensor]) -> str:
    """The parameter whose optimizer state holds a component's block statistics: its first that requires a
    gradient (torch.distributed.checkpoint loads no state into a frozen parameter)."""
    return next((n for n in names if params[n].requires_grad), names[0])


def make_distributor(cfg: DistributedConfig, stages: list[Stage], params: Mapping[str, torch.Tensor],
                     mode: str) -> Distributor:
    """The plan for `mode` ("replicated" or "fsdp"): components, owners and row layouts."""
    if mode == "fsdp":
        meshes = [p.device_mesh for p in params.values() if isinstance(p, DTensor)]
        if not meshes:
            raise ValueError("distributed_mode='fsdp' needs the model sharded first: its parameters are plain "
                             "tensors, not DTensors. Call torch.distributed.fsdp.fully_shard on the model (each "
                             "block, then the root) before building Symo, or leave distributed_mode out for DDP "
                             "or one process")
        if meshes[0].ndim != 1 or any(m != meshes[0] for m in meshes):
            raise NotImplementedError("distributed_mode='fsdp' supports DTensor parameters on one 1-D device "
                                      "mesh (fully_shard over one process group); HSDP and 2-D meshes are not "
                                      "supported yet")
        group = meshes[0].get_group()
    else:
        if not dist.is_available() or not dist.is_initialized():
            group = None
        else:
            group = dist.group.WORLD
    world = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    comps = []
    found = coupling_components(stages)
    # a frozen component computes nothing: it must not take a rank's share
    costs = [component_cost(stages, blocks, ps) if any(params[n].requires_grad for n in ps) else 0.0
             for ps, blocks in found]
    for (ps, blocks), cost, owner in zip(found, costs, assign_owners(costs, world)):
        comps.append(Component(ps, blocks, cost, owner, anchor(ps, params)))
    shapes = dict(stages[0].compiled.shapes)
    rows = {n: _rows(n, params[n], shapes[n], world, rank) for n in shapes}
    comm = None if cfg.comm_dtype == "auto" else COMM_DTYPES[cfg.comm_dtype]
    return Distributor(mode, comps, shapes, rows, rank, world, group, comm, max(1, int(cfg.bucket_mb * 2**20)))


def _rows(name: str, p: torch.Tensor, shape: tuple[int, ...], world: int, rank: int) -> list[int] | None:
    """Rows of dim 0 per rank for a parameter sharded as FSDP2 shards it (torch.chunk), None if whole."""
    if not isinstance(p, DTensor) or all(isinstance(pl, Replicate) for pl in p.placements):
        return None
    if tuple(p.placements) != (Shard(0),):
        raise NotImplementedError(f"parameter {name!r} is placed {p.placements}; Symo's fsdp mode takes Shard(0) "
                                  "(fully_shard's default) or Replicate")
    chunks = [c.shape[0] for c in torch.empty(shape[0], 0).chunk(world)]
    rows = chunks + [0] * (world - len(chunks))
    if p.to_local().shape[0] != rows[rank]:
        raise NotImplementedError(f"parameter {name!r} holds {p.to_local().shape[0]} rows on rank {rank}, not "
                                  f"torch.chunk's {rows[rank]}; this sharding is not supported")
    return rows


def zeros_like_param(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Zeros for a parameter without a gradient, of the kind `like` is: a replicated DTensor on the
    implicit path (a plain tensor would meet DTensors in one torch.cat), a plain tensor otherwise."""
    zeros = torch.zeros(shape, dtype=like.dtype, device=like.device)
    if isinstance(like, DTensor):
        return DTensor.from_local(zeros, like.device_mesh, [Replicate()] * like.device_mesh.ndim, run_check=False)
    return zeros


def shard_like(full: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A whole tensor with `p`'s rows (of `p`'s shape, or NorMuon's one statistic per row) as a DTensor placed like
    `p` (this rank's rows of it, no collective)."""
    if not isinstance(p, DTensor) or isinstance(full, DTensor):
        return full
    local = full = full.contiguous()
    if tuple(p.placements) == (Shard(0),):
        rows = _rows("", p, tuple(p.shape), p.device_mesh.size(), p.device_mesh.get_local_rank())
        rank = p.device_mesh.get_local_rank()
        local = full.narrow(0, sum(rows[:rank]), rows[rank])
    return DTensor.from_local(local.clone(), p.device_mesh, p.placements, run_check=False, shape=full.shape,
                              stride=full.stride())

