"""Checks of the Symo optimizer's inputs, as torch.optim checks its own: option types and ranges
(TypeError / ValueError naming the option), param-group options, and state dicts at load time
(another spec, width or parameter set is refused before anything is loaded)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .compiler import Spec
from .runtime.compiled import CompiledSpec

if TYPE_CHECKING:
    from .optim import Symo, SymoConfig


_FLOATS = ("beta1", "beta2", "damping", "power", "weight_decay", "adamw_rms", "adamw_lr", "adamw_eps", "adamw_wd")
_INTS = ("precondition_frequency", "eigh_max_size", "ns_steps", "ns_inverse_steps")
_BOOLS = ("nesterov", "check_finite", "compile")
_CHOICES = {"source": ("momentum", "gradient"), "damping_mode": ("relative", "absolute"),
            "estimator": ("gradient", "taylor"), "update_scale": ("natural", "muon", "adamw"),
            "backend": ("auto", "eigh", "newton_schulz"), "ns_method": ("auto", "iterate", "spectral"),
            "stats_dtype": ("auto", "float64", "float32")}


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_types(cfg: SymoConfig) -> None:
    """TypeError naming the option for a value of the wrong kind (before any comparison misleads)."""
    for name in _FLOATS:
        if not _is_real(getattr(cfg, name)):
            raise TypeError(f"{name} must be a number, got {getattr(cfg, name)!r}")
    for name in _INTS:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r}")
    for name in _BOOLS:
        if not isinstance(getattr(cfg, name), bool):
            raise TypeError(f"{name} must be True or False, got {getattr(cfg, name)!r}")
    for name, allowed in _CHOICES.items():
        if not isinstance(getattr(cfg, name), str):
            raise TypeError(f"{name} must be one of {allowed}, got {getattr(cfg, name)!r}")
    for name in ("ns_coeffs", "adamw_betas"):
        value = getattr(cfg, name)
        if not isinstance(value, (tuple, list)) or not all(_is_real(c) for c in value):
            raise TypeError(f"{name} must be a tuple of numbers, got {value!r}")
    gm = cfg.geometric_mean_with
    if gm is not None and not isinstance(gm, (str, Path, Spec, CompiledSpec)):
        raise TypeError(f"geometric_mean_with must be a spec (path, name, Spec or CompiledSpec), got {gm!r}")


def _adamw_checks(lr: object, betas: object, eps: object, wd: object) -> list[tuple[bool, str]]:
    """torch.optim.AdamW's checks, for the built-in AdamW's options (global or per group)."""
    for name, value in (("adamw_lr", lr), ("adamw_eps", eps), ("adamw_wd", wd)):
        if not _is_real(value):
            raise TypeError(f"{name} must be a number, got {value!r}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(_is_real(b) for b in betas):
        raise TypeError(f"adamw_betas must be a pair of numbers, got {betas!r}")
    return [
        (0.0 <= lr < math.inf, f"Invalid adamw_lr: {lr} (must be a finite number >= 0)"),
        (0.0 <= eps < math.inf, f"Invalid adamw_eps value: {eps} (must be a finite number >= 0)"),
        (0.0 <= betas[0] < 1.0, f"Invalid adamw_betas[0]: {betas[0]} (must be in [0, 1))"),
        (0.0 <= betas[1] < 1.0, f"Invalid adamw_betas[1]: {betas[1]} (must be in [0, 1))"),
        (0.0 <= wd < math.inf, f"Invalid adamw_wd value: {wd} (must be a finite number >= 0)"),
    ]


def _check_group_options(opts: dict[str, Any], where: str) -> None:
    """The per-group options (lr, beta1, nesterov, weight_decay, adamw_*), as torch checks them."""
    for name in ("lr", "beta1", "weight_decay"):
        if not _is_real(opts[name]) and not (name == "lr" and torch.is_tensor(opts[name])):
            raise TypeError(f"{where}{name} must be a number, got {opts[name]!r}")
    lr = float(opts["lr"])
    checks = [
        (0.0 <= lr < math.inf, f"Invalid learning rate: {lr} ({where}lr must be a finite number >= 0)"),
        (0.0 <= opts["beta1"] < 1.0, f"{where}beta1 must be in [0, 1), got {opts['beta1']}"),
        (0.0 <= opts["weight_decay"] < math.inf,
         f"Invalid weight_decay value: {opts['weight_decay']} ({where}weight_decay must be a finite number >= 0)"),
        (isinstance(opts["nesterov"], bool), f"{where}nesterov must be True or False, got {opts['nesterov']!r}"),
        *_adamw_checks(opts["adamw_lr"], opts["adamw_betas"], opts["adamw_eps"], opts["adamw_wd"]),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message if where == "" or message.startswith(where) else f"{where}{message}")


def _check_state_dict(opt: Symo, state_dict: object) -> None:
    """Refuse, before anything is loaded, a state dict saved by another spec, width or parameter set."""
    if not isinstance(state_dict, Mapping) or not {"state", "param_groups"} <= set(state_dict):
        raise TypeError("load_state_dict expects the dict returned by Symo.state_dict() "
                        "(with 'state' and 'param_groups')")
    meta = state_dict.get("symo")
    if meta is not None:
        mine = [st.compiled for st in opt._stages]
        if list(meta.get("keys", [])) != [c.key for c in mine]:
            raise ValueError(f"load_state_dict: the checkpoint was saved for spec {meta.get('spec')!r} (or another "
                             f"parameter layout); this optimizer uses spec {opt.compiled.name!r}")
        for saved, c in zip(meta.get("sizes", []), mine):
            diff = {k: (v, c.sizes.get(k)) for k, v in saved.items() if c.sizes.get(k) != v}
            if diff:
                shown = dict(list(diff.items())[:4])
                raise ValueError(f"load_state_dict: the checkpoint was saved for other widths; (saved, now): {shown}")
    groups = state_dict["param_groups"]
    saved_names = [n for g in groups for n in g.get("param_names", [])]
    my_names = [n for g in opt.param_groups for n in g["param_names"]]
    if saved_names and set(saved_names) != set(my_names):
        raise ValueError(f"load_state_dict: the checkpoint was saved for other parameters (only in the checkpoint: "
                         f"{sorted(set(saved_names) - set(my_names))[:3]}; only here: "
                         f"{sorted(set(my_names) - set(saved_names))[:3]})")
    if len(groups) != len(opt.param_groups):
        raise ValueError(f"load_state_dict: the checkpoint has {len(groups)} parameter groups, this optimizer "
                         f"{len(opt.param_groups)}; build the optimizer with the same parameters and groups")
    for k, (saved, mine) in enumerate(zip(groups, opt.param_groups)):
        names = saved.get("param_names")
        if names is not None and list(names) != list(mine["param_names"]):
            extra = sorted(set(names) - set(mine["param_names"]))[:3]
            missing = sorted(set(mine["param_names"]) - set(names))[:3]
            raise ValueError(f"load_state_dict: group {k} was saved for other parameters (only in the checkpoint: "
                             f"{extra}; only here: {missing})")
        if len(saved["params"]) != len(mine["params"]):
            raise ValueError(f"load_state_dict: group {k} has {len(saved['params'])} parameters in the checkpoint "
                             f"and {len(mine['params'])} here")
        for i, name, p in zip(saved["params"], mine["param_names"], mine["params"]):
            for key, v in state_dict["state"].get(i, {}).items():
                if torch.is_tensor(v) and key != "step" and tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"load_state_dict: state {key!r} of parameter {name!r} has shape "
                                     f"{tuple(v.shape)}, the parameter {tuple(p.shape)}")
    for stage in opt._stages:
        blocks = {b.id: b for b in stage.compiled.blocks}
        for bid, st in state_dict["state"].get(stage.key, {}).items():
            if bid not in blocks:
                raise ValueError(f"load_state_dict: block {bid!r} of the checkpoint is not a block of spec "
                                 f"{stage.compiled.name!r}")
            b = blocks[bid]
            for key, v in st.items():
                if torch.is_tensor(v) and v.dim() > 0 and tuple(v.shape) != (b.batch, b.mult, b.mult):
                    raise ValueError(f"load_state_dict: statistic {key!r} of block {bid} has shape {tuple(v.shape)}, "
                                     f"expected {(b.batch, b.mult, b.mult)}")
