"""The optimizer state beyond torch's per-parameter entries: the checkpoint's description of the plan it was
saved for, the loaded block statistics made the optimizer's own (on the parameters' device, in the layout
this optimizer keeps), and the state of several processes consolidated into one process's layout."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from .adamw import moment_dtype
from .distributed import shard_like
from .plan import Stage


def checkpoint_meta(plan: list[Stage], kind: str) -> dict[str, Any]:
    """What `load_state_dict` checks a checkpoint against: the spec, each stage's key and sizes, and the
    preconditioner kind (whose typed block state it holds)."""
    return {"spec": plan[0].compiled.name, "keys": [st.compiled.key for st in plan],
            "sizes": [dict(st.compiled.sizes) for st in plan], "kind": kind}


def own_loaded_state(opt: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """After torch's load_state_dict: torch casts per-parameter state to the parameter's dtype (bf16
    momentum, float64 statistics!) and keeps `step` shared with the loaded dict, so per-parameter moments
    are made private copies on the parameter's device, in the dtype a fresh optimizer keeps for it
    (moment_dtype: float32 at least) (whole tensors of a consolidated checkpoint
    become this rank's shards of a DTensor parameter); block statistics (keyed by block id, under the
    stage's key or on an anchor parameter) move to the device of their block's first parameter."""
    keys = {stage.key for stage in opt.plan}
    saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
    for i, p in zip(saved_ids, (p for g in opt.param_groups for p in g["params"])):
        for k, v in state_dict["state"].get(i, {}).items():
            if torch.is_tensor(v) and k == "step":
                opt.state[p][k] = v.to(device=v.device, copy=True)
            elif torch.is_tensor(v):  # in the dtype this optimizer keeps; for a sharded parameter its rows
                dtype = moment_dtype(p.dtype) if v.is_floating_point() else v.dtype
                opt.state[p][k] = shard_like(v.to(device=p.device, dtype=dtype, copy=True), p)
            elif k in keys and isinstance(v, dict):
                opt.state[p][k] = {b: _owned(st, p.device) for b, st in v.items()}
    devices = {n: p.device for g in opt.param_groups for n, p in zip(g["param_names"], g["params"])}
    for stage in opt.plan:
        blocks = opt.state.get(stage.key)
        if blocks:
            where = {b.id: devices[b.params[0]] for b in stage.compiled.blocks if b.params}
            opt.state[stage.key] = {b: _owned(st, where.get(b, next(iter(devices.values()))))
                                    for b, st in blocks.items()}
    relayout_blocks(opt)


def relayout_blocks(opt: Any) -> None:
    """Block statistics where this optimizer keeps them, on each component's anchor parameter, whichever
    layout the checkpoint used: under the stage's key alone (consolidated checkpoints, and those of
    earlier versions) or on anchor parameters; with several processes the owned blocks only (the other
    ranks' blocks are theirs)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    for k, stage in enumerate(opt.plan):
        found: dict[str, dict] = dict(opt.state.pop(stage.key, None) or {})
        for p in params:
            if p in opt.state and isinstance(opt.state[p].get(stage.key), dict):
                found.update(opt.state[p].pop(stage.key))
        for bid, st in found.items():
            if opt.distributor is None or bid in opt.distributor.owned[k]:
                opt.state[opt.anchors[(k, bid)]].setdefault(stage.key, {})[bid] = st


def _owned(st: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: (v.to(device, copy=True) if torch.is_tensor(v) else v) for k, v in st.items()}


def consolidated_state_dict(opt: Any) -> dict[str, Any]:
    """`opt.state_dict()` consolidated: DTensor state gathered into whole tensors, and every owner's block
    statistics gathered under the stages' keys. Collective: every rank calls it and gets the same dict,
    which `load_state_dict` takes on any number of ranks (one process included)."""
    sd = opt.state_dict()
    distributor = opt.distributor
    keys = [stage.key for stage in opt.plan]
    mine: dict[str, dict] = {key: {} for key in keys}
    state: dict[Any, Any] = {}
    for i in sorted(sd["state"], key=str):  # the same order on every rank: full_tensor is a collective
        entry = dict(sd["state"][i])
        for key in keys:
            mine[key].update(entry.pop(key, None) or {})
        state[i] = {k: (entry[k].full_tensor() if isinstance(entry[k], DTensor) else entry[k]) for k in sorted(entry)}
    gathered: list[Any] = [None] * (1 if distributor is None else distributor.world)
    if len(gathered) > 1:
        dist.all_gather_object(gathered, {k: {b: {n: (v.cpu() if torch.is_tensor(v) else v) for n, v in st.items()}
                                              for b, st in blocks.items()} for k, blocks in mine.items()},
                               group=distributor.group)
    else:
        gathered = [mine]
    for key in keys:
        blocks = {b: st for theirs in gathered for b, st in theirs[key].items()}
        if blocks:
            state[key] = blocks
    return {**sd, "state": state}


def state_bytes(state: Any) -> int:
    """Bytes held in the tensors of an optimizer's state (momentum, AdamW moments, block statistics)."""
    return sum(t.numel() * t.element_size() for v in state.values() for t in _tensors(v))


def _tensors(v: Any) -> Iterable[torch.Tensor]:
    if torch.is_tensor(v):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from _tensors(x)


def block_state(opt: Any, k: int, stage: Stage, bid: str) -> dict[str, Any]:
    """Block `bid`'s statistics (stage `k`), in the state of its component's anchor parameter
    (see `distributed.distribute`)."""
    return opt.state[opt.anchors[(k, bid)]].setdefault(stage.key, {}).setdefault(bid, {"step": 0})


def block_statistics(opt: Any, key: str) -> dict[str, dict[str, Any]]:
    """{block id: the block's state} of the stage stored under `key`, gathered from the anchor
    parameters' state (with several processes: the blocks this rank owns)."""
    return {b: st for v in opt.state.values() if isinstance(v, dict) and isinstance(v.get(key), dict)
            for b, st in v[key].items()}


def deep_copy(opt: Any, memo: dict[int, Any]) -> Any:
    """copy.deepcopy of an optimizer: its state, groups, kind and hooks copied (with the model when both are
    copied together, the same memo maps the parameters), its compiled spec and plan shared (they never change)."""
    if opt.distributor is not None:
        raise TypeError("a Symo over several processes cannot be deep-copied (its process group is not): "
                        "save opt.state_dict() and load it into an optimizer built on the copy")
    for shared in (opt.compiled, opt.plan, *opt.plan, *(stage.compiled for stage in opt.plan), opt.preset,
                   opt.base_config, opt.config):  # frozen: shared, not copied
        memo[id(shared)] = shared
    new = opt.__class__.__new__(opt.__class__)
    memo[id(opt)] = new
    new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in opt.__dict__.items() if k != "_compiled_step"})
    new._compiled_step = None  # a torch.compile'd step is rebuilt on first use
    return new


PICKLE_REFUSAL = ("Symo cannot be pickled (its compiled spec holds generated code): save opt.state_dict() with "
                  "torch.save and load it into a Symo built the same way; copy.deepcopy(opt) works in-process")
