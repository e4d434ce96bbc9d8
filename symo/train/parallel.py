"""How `symo train` spreads over the processes torchrun starts: DDP (the default) or FSDP2 (`--fsdp`), with
Symo's distributed mode to match, and the whole-model checkpoint both write: every rank gathers the
states, rank 0 writes them, and every rank reads them back into its own layout (docs/distributed.md)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from ..optim import Symo
from .models import GPT

WHOLE = StateDictOptions(full_state_dict=True)


def sharded(fsdp: bool, world: int) -> bool:
    """FSDP2 applies under torchrun only; one process trains the plain model."""
    return fsdp and world > 1


def distributed_mode(fsdp: bool, world: int) -> str:
    """Symo's distributed_mode: each block's matrix function on one rank whenever there are several."""
    if world == 1:
        return "off"
    return "fsdp" if fsdp else "replicated"


def shard(model: GPT) -> None:
    """fully_shard each transformer block, then the root (embeddings, final norm, the tied head). Before
    the optimizer is built: the optimizer steps the DTensor parameters this leaves."""
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)


def wrap(model: GPT, fsdp: bool, world: int, device: str) -> torch.nn.Module:
    """The module the steps run through: the model itself (one process, or already sharded), or DDP."""
    if world == 1 or fsdp:
        return model
    return DistributedDataParallel(model, device_ids=[device] if device.startswith("cuda") else None)


def gather_states(model: GPT, opt: torch.optim.Optimizer, fsdp: bool, world: int) -> tuple[dict, dict]:
    """(model state, optimizer state) as one process holds them. Collective when sharded or when Symo
    keeps block statistics on their owners: every rank calls it."""
    if sharded(fsdp, world):
        model_state = get_model_state_dict(model, options=WHOLE)
        if isinstance(opt, Symo):
            return model_state, opt.full_state_dict()
        return model_state, get_optimizer_state_dict(model, opt, options=WHOLE)
    if isinstance(opt, Symo):
        return model.state_dict(), opt.full_state_dict()
    return model.state_dict(), opt.state_dict()


def load_states(model: GPT, opt: torch.optim.Optimizer, blob: dict[str, Any], fsdp: bool, world: int) -> None:
    """The inverse of `gather_states`, on every rank: whole tensors in, this rank's layout kept."""
    if sharded(fsdp, world):
        set_model_state_dict(model, blob["model"], options=WHOLE)
        if isinstance(opt, Symo):
            opt.load_state_dict(blob["optimizer"])
        else:
            set_optimizer_state_dict(model, opt, blob["optimizer"], options=WHOLE)
        return
    model.load_state_dict(blob["model"])
    opt.load_state_dict(blob["optimizer"])
