"""The optimizer a `symo train` run names (TrainConfig.optimizer): AdamW, the Muon baseline, or Symo on the run's
spec with its preset and the options set over it (--symo-option, checked before anything is built).
"""

from __future__ import annotations

from typing import Any

import torch

from ..compiler import Spec, load_spec
from ..optim import Symo, SymoConfig
from ..optim.presets import get_preset
from ..runtime.compiled import compile
from .config import TrainConfig
from .models import GPT
from .muon import Muon
from .parallel import distributed_mode

__all__ = ["build_optimizer", "check_head_sizes", "check_symo_options", "head_basis_sizes", "symo_overrides"]


def head_basis_sizes(spec: Spec, d_head: int) -> dict[str, int] | None:
    """The sizes a GPT's shapes leave free: every space repeated per a space of free size (gpt_true's per-head
    bases, one per head) is a head's basis, d_head long. A space repeated per a space of declared size
    (gpt_muon_qkv's rows of query, key and value) is left to the shapes."""
    free = {s.name for s in spec.spaces if s.size is None}
    return {s.name: d_head for s in spec.spaces if s.per in free and s.size is None} or None


def check_head_sizes(cfg: TrainConfig) -> None:
    """A spec whose per-head bases are declared at a width other than this run's heads is refused before anything
    is built (ValueError naming the spaces and the fix): its "heads" would each span parts of several of the
    model's, whose gauges are then not symmetries, with no other sign of it."""
    if cfg.optimizer != "symo":
        return
    spec = load_spec(cfg.spec)
    free = {s.name for s in spec.spaces if s.size is None}
    d_head = cfg.n_embd // cfg.n_head
    wrong = {s.name: s.size for s in spec.spaces if s.per in free and s.size is not None and s.size != d_head}
    if wrong:
        names = ", ".join(f"{name!r} ({size})" for name, size in wrong.items())
        width = next(iter(wrong.values()))
        heads = f" or --n-head {cfg.n_embd // width}" if cfg.n_embd % width == 0 else ""
        raise ValueError(f"--spec {cfg.spec}: its per-head bases {names} are declared at another width than this "
                         f"run's heads, {d_head} (--n-embd {cfg.n_embd} / --n-head {cfg.n_head}), so each of its "
                         "heads would span parts of several of the model's. Use --spec gpt_true (per-head gauges "
                         f"sized from the model){heads}, or a copy of the spec with size = {d_head}")


def build_optimizer(model: GPT, cfg: TrainConfig, world: int = 1) -> torch.optim.Optimizer:
    """The optimizer of `cfg`; under torchrun (`world` > 1) Symo shares its blocks out among the ranks."""
    named = list(model.named_parameters())
    mode = distributed_mode(cfg.fsdp, world)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW([p for _, p in named], lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    if cfg.optimizer == "muon":
        return Muon(named, lr=cfg.lr, weight_decay=cfg.weight_decay, adamw_lr=cfg.adamw_lr)
    spec = load_spec(cfg.spec)
    sizes = head_basis_sizes(spec, cfg.n_embd // cfg.n_head)
    compiled = compile(spec, {n: tuple(p.shape) for n, p in named}, sizes=sizes, strict=not cfg.partial)
    return Symo(named, compiled, lr=cfg.lr, preset=cfg.preset, weight_decay=cfg.weight_decay, adamw_lr=cfg.adamw_lr,
                distributed_mode=mode, **symo_overrides(cfg))


def symo_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """The Symo options a run sets over its preset (or over Symo's defaults, with Muon's scale): --ns-method and
    --precondition-frequency where given, then every --symo-option."""
    extra: dict[str, Any] = {} if cfg.preset is not None else {"update_scale": "muon"}
    if cfg.ns_method != "auto" or cfg.preset is None:
        extra["ns_method"] = cfg.ns_method
    if cfg.precondition_frequency is not None:
        extra["precondition_frequency"] = cfg.precondition_frequency
    return {**extra, **cfg.symo_options}


def check_symo_options(cfg: TrainConfig) -> None:
    """The run's --symo-option values, checked by Symo's own config before anything is built (ValueError naming
    the flag), so a bad one leaves no run folder behind."""
    if cfg.optimizer != "symo" or not cfg.symo_options:
        return
    base = SymoConfig(**get_preset(cfg.preset).values) if cfg.preset is not None else SymoConfig()
    try:
        base.replace(**symo_overrides(cfg))
    except (TypeError, ValueError) as err:
        given = " ".join(f"{k}={v}" for k, v in cfg.symo_options.items())
        raise ValueError(f"--symo-option ({given}): {err} (from the command line a value is a number, true / false, "
                         "none, a name or a comma-separated tuple; an option whose value is an object, such as "
                         "refresh=PowerQR(...), is set from Python: symo.Symo(..., refresh=...))") from None
