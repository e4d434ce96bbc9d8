"""The optimizer state beyond torch's per-parameter entries: the checkpoint's description of the plan it was
saved for, and the loaded block statistics made the optimizer's own (on the parameters' device)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .plan import Stage


def checkpoint_meta(plan: list[Stage]) -> dict[str, Any]:
    """What `load_state_dict` checks a checkpoint against: the spec, and each stage's key and sizes."""
    return {"spec": plan[0].compiled.name, "keys": [st.compiled.key for st in plan],
            "sizes": [dict(st.compiled.sizes) for st in plan]}


def own_loaded_state(opt: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """After torch's load_state_dict: torch casts per-parameter state to the parameter's dtype (bf16
    momentum!) and keeps `step` shared with the loaded dict, so the saved dtypes are restored as private
    copies; block statistics (plain tensors keyed by block id) move to the parameters' device."""
    saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
    for i, p in zip(saved_ids, (p for g in opt.param_groups for p in g["params"])):
        for k, v in state_dict["state"].get(i, {}).items():
            if torch.is_tensor(v):
                opt.state[p][k] = v.to(device=v.device if k == "step" else p.device, copy=True)
    device = next(p.device for g in opt.param_groups for p in g["params"])
    for stage in opt.plan:
        blocks = opt.state.get(stage.key)
        if blocks:
            opt.state[stage.key] = {b: {k: (v.to(device, copy=True) if torch.is_tensor(v) else v)
                                        for k, v in st.items()} for b, st in blocks.items()}


def state_bytes(state: Any) -> int:
    """Bytes held in the tensors of an optimizer's state (momentum, AdamW moments, block statistics)."""
    return sum(t.numel() * t.element_size() for v in state.values() for t in _tensors(v))


def _tensors(v: Any) -> Iterable[torch.Tensor]:
    if torch.is_tensor(v):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from _tensors(x)
