"""Checks of the Symo optimizer's inputs, as torch.optim checks its own: option types and ranges
(TypeError / ValueError naming the option), parameters and param-group options, and state dicts at load
time (another spec, width or parameter set is refused before anything is loaded)."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..compiler import Spec
from ..runtime.compiled import CompiledSpec
from .matrix_function_configs import MatrixFunction
from .neuron_norm import STATE_KEY as NEURON_STATE_KEY

if TYPE_CHECKING:
    from .plan import Stage

# Options a param group may override; the curvature options are per block, and a block may span
# parameters of several groups, so those stay global (SymoConfig).
NamedParams = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor] | Iterable[dict[str, Any]]
GROUP_KEYS = ("lr", "beta1", "nesterov", "weight_decay", "adamw_lr", "adamw_betas", "adamw_eps", "adamw_wd")


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _choices(hint: object) -> tuple[object, ...] | None:
    """The values an option of type `hint` may take when they can be listed (a Literal, bool, None, or a union of
    those); None when they cannot."""
    if hint is bool:
        return (True, False)
    if hint is type(None):
        return (None,)
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    return None


def _of_type(value: object, example: object) -> bool:
    """`value` is of the type of the choice `example` (a bool is not an int here, nor an int a bool)."""
    if isinstance(example, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(example, bool)
    return isinstance(value, type(example))


def _config_class(hint: object) -> bool:
    """`hint` is a matrix-function config class (Eigh, NewtonSchulz, ...: symo.optim.matrix_function_configs)."""
    return isinstance(hint, type) and issubclass(hint, MatrixFunction)


def _config_word(hint: type) -> str:
    """How a message names a config class: Eigh(), NewtonSchulz(...)."""
    return f"{hint.__name__}({'...' if fields(hint) else ''})"


def _is_choice(value: object, choices: tuple[object, ...]) -> bool:
    return any(_of_type(value, c) and value == c for c in choices)


_NOTHING = object()  # a value of no option type, to word what a type wants


def choice_problem(name: str, hint: object, value: object) -> TypeError | ValueError | None:
    """The error for a value of a choice option (a Literal, or a union holding one) that is not one of its
    choices: TypeError when the value is of none of the choices' types (nor of another member of the union),
    ValueError when it is; both say `<name> must be one of 'a', 'b'; got 'x'`. None: the value is allowed, or
    the option is not a choice option."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    members = args if origin in (typing.Union, types.UnionType) else (hint,)
    listed = [_choices(m) for m in members]
    if not any(typing.get_origin(m) is typing.Literal for m in members):
        return None
    choices = tuple(c for cs in listed if cs is not None for c in cs)
    if _is_choice(value, choices):
        return None
    others = [m for m, cs in zip(members, listed) if cs is None]
    if any(type_problem(m, value) is None for m in others):
        return None  # allowed by a member that is not a list of choices (an int, a class)
    said = ", ".join(repr(c) for c in choices)
    configs = [_config_word(m) for m in others if _config_class(m)]
    others = [m for m in others if not _config_class(m)]
    wanted = f"one of {said}" if not others else " or ".join(
        [p for p in (type_problem(m, _NOTHING) for m in others) if p] + [f"one of {said}"])
    if configs:  # a matrix function: its string spellings or its configs
        wanted += f" or a config {', '.join(configs)} (symo.optim)"
    message = f"{name} must be {wanted}; got {value!r}"
    same_type = any(_of_type(value, c) for c in choices)
    return ValueError(message) if same_type else TypeError(message)


def type_problem(hint: object, value: object) -> str | None:
    """What a value of option type `hint` must be, when `value` is not one (None: it is, or the type is one
    that the config checks itself: a class, a spec, a union of classes). Choices (Literal) are `choice_problem`'s."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _config_class(hint):
        return None if isinstance(value, hint) else _config_word(hint)
    if hint is bool:
        return None if isinstance(value, bool) else "True or False"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "an int"
    if hint is float:
        return None if _is_real(value) else "a number"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    if origin is typing.Literal:
        return None  # choice_problem
    if origin is tuple:
        ok = isinstance(value, (tuple, list)) and all(type_problem(a, v) is None for a, v in zip(args, value))
        return None if ok else "a tuple of numbers"
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        plain = [a for a in args if a is not type(None)]
        if not all(a in (int, float, str) for a in plain):
            return None  # a union of classes (the config's own check words it) or holding choices (choice_problem)
        problems = [type_problem(a, value) for a in plain]
        return None if None in problems else " or ".join(p for p in problems if p)
    return None


def check_types(cfg: object, prefix: str = "") -> None:
    """TypeError naming the option for a value of the wrong kind (before any comparison misleads), and for a
    choice option (Literal) a value that is not one of its choices (ValueError; TypeError when it is not even of
    their type): every option's type and choices read from its config dataclass's annotation (the one statement
    of them). `prefix`: what the option's flat name adds to the field's name (DistributedConfig's
    `distributed_`)."""
    hints = typing.get_type_hints(type(cfg))
    for f in fields(cfg):
        value, name = getattr(cfg, f.name), prefix + f.name
        choice = choice_problem(name, hints[f.name], value)
        if choice is not None:
            raise choice
        problem = type_problem(hints[f.name], value)
        if problem is not None:
            raise TypeError(f"{name} must be {problem}, got {value!r}")
    gm = getattr(cfg, "geometric_mean_with", None)
    if gm is not None and not isinstance(gm, (str, Path, Spec, CompiledSpec)):
        raise TypeError(f"geometric_mean_with must be a spec (path, name, Spec or CompiledSpec), got {gm!r}")


def raise_first(checks: Iterable[tuple[bool, str]]) -> None:
    """ValueError with the message of the first failed (ok, message) check."""
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def adamw_checks(lr: object, betas: object, eps: object, wd: object) -> list[tuple[bool, str]]:
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


def check_group_options(opts: dict[str, Any], where: str) -> None:
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
        *adamw_checks(opts["adamw_lr"], opts["adamw_betas"], opts["adamw_eps"], opts["adamw_wd"]),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message if where == "" or message.startswith(where) else f"{where}{message}")


def check_state_dict(state_dict: object, stages: list[Stage], param_groups: list[dict[str, Any]], kind: Any) -> None:
    """Refuse, before anything is loaded, a state dict saved by another spec, width, parameter set or
    preconditioner kind (`stages`: the optimizer's block plan; `param_groups`: its torch param groups; `kind`:
    its preconditioner, which declares the block state it keeps)."""
    if not isinstance(state_dict, Mapping) or not {"state", "param_groups"} <= set(state_dict):
        raise TypeError("load_state_dict expects the dict returned by Symo.state_dict() "
                        "(with 'state' and 'param_groups')")
    foreign = [i for i, g in enumerate(state_dict["param_groups"]) if not isinstance(g, Mapping) or "kind" not in g]
    if foreign:
        raise ValueError(f"load_state_dict: this state dict was not saved by Symo (param group {foreign[0]} has no "
                         "'kind'; another optimizer's, e.g. torch.optim.AdamW's?): load it into that optimizer, "
                         "or start Symo afresh")
    meta = state_dict.get("symo")
    if meta is not None and meta.get("kind", kind.name) != kind.name:
        raise ValueError(f"load_state_dict: the checkpoint was saved by preconditioner {meta['kind']!r}; this "
                         f"optimizer uses {kind.name!r} (their block states differ): build the optimizer with "
                         f"preconditioner={meta['kind']!r}, or start the new kind's statistics afresh")
    if meta is not None:
        mine = [st.compiled for st in stages]
        if list(meta.get("keys", [])) != [c.key for c in mine]:
            why = ("the same name, but its spaces, rules or sizes differ: the spec file was edited, or the "
                   "parameters are others" if meta.get("spec") == mine[0].name else "or another parameter layout")
            raise ValueError(f"load_state_dict: the checkpoint was saved for spec {meta.get('spec')!r} ({why}); "
                             f"this optimizer uses spec {mine[0].name!r}. Load it with the spec and model it was "
                             "saved with, or start the optimizer afresh")
        for saved, c in zip(meta.get("sizes", []), mine):
            diff = {k: (v, c.sizes.get(k)) for k, v in saved.items() if c.sizes.get(k) != v}
            if diff:
                shown = dict(list(diff.items())[:4])
                raise ValueError(f"load_state_dict: the checkpoint was saved for other widths; (saved, now): {shown}")
    groups = state_dict["param_groups"]
    saved_names = [n for g in groups for n in g.get("param_names", [])]
    my_names = [n for g in param_groups for n in g["param_names"]]
    if saved_names and set(saved_names) != set(my_names):
        raise ValueError(f"load_state_dict: the checkpoint was saved for other parameters (only in the checkpoint: "
                         f"{sorted(set(saved_names) - set(my_names))[:3]}; only here: "
                         f"{sorted(set(my_names) - set(saved_names))[:3]})")
    if len(groups) != len(param_groups):
        raise ValueError(f"load_state_dict: the checkpoint has {len(groups)} parameter groups, this optimizer "
                         f"{len(param_groups)}; build the optimizer with the same parameters and groups")
    for k, (saved, mine) in enumerate(zip(groups, param_groups)):
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
                want = (p.shape[0], 1) if key == NEURON_STATE_KEY else tuple(p.shape)  # NorMuon's: one per row
                if torch.is_tensor(v) and key != "step" and tuple(v.shape) != tuple(want):
                    raise ValueError(f"load_state_dict: state {key!r} of parameter {name!r} has shape "
                                     f"{tuple(v.shape)}, expected {tuple(want)} for the parameter's "
                                     f"{tuple(p.shape)}")
    for k, stage in enumerate(stages):
        blocks = {b.id: b for b in stage.compiled.blocks}
        # state_dict() keeps them on each block's anchor parameter, a consolidated checkpoint under the stage's key
        saved = [state_dict["state"].get(stage.key, {})] + [
            v[stage.key] for k, v in state_dict["state"].items()
            if k != stage.key and isinstance(v, Mapping) and isinstance(v.get(stage.key), Mapping)]
        for bid, st in (item for d in saved for item in d.items()):
            if bid not in blocks:
                raise ValueError(f"load_state_dict: block {bid!r} of the checkpoint is not a block of spec "
                                 f"{stage.compiled.name!r}")
            expected = kind.state_shapes(blocks[bid], k, len(stages))
            for key, v in (st.items() if isinstance(st, Mapping) else ()):
                if key not in expected:
                    raise ValueError(f"load_state_dict: block {bid} holds state {key!r}, which preconditioner "
                                     f"{kind.name!r} does not keep (it keeps {sorted(expected)})")
                shape = expected[key]
                if torch.is_tensor(v) and shape is not None and tuple(v.shape) != shape:
                    raise ValueError(f"load_state_dict: state {key!r} of block {bid} has shape {tuple(v.shape)}, "
                                     f"expected {shape}")


def normalise_groups(params: NamedParams) -> list[dict[str, Any]]:
    """-> [{"params": [(name, tensor), ...], **options}], rejecting unnamed tensors."""
    if torch.is_tensor(params) or isinstance(params, (str, bytes)) or not isinstance(params, (Iterable, Mapping)):
        raise TypeError("params must be named parameters: model.named_parameters(), a {name: param} dict or "
                        f"param groups; got {type(params).__name__}")
    if isinstance(params, Mapping):
        params = list(params.items())
    params = list(params)
    if not params:
        raise ValueError("Symo got an empty parameter list")
    groups = params if isinstance(params[0], dict) else [{"params": params}]
    out, seen, tensors = [], set(), {}
    for g in groups:
        if not isinstance(g, dict):
            raise TypeError("mix of param-group dicts and (name, param) pairs")
        unknown = set(g) - {"params", *GROUP_KEYS}
        if unknown:
            raise ValueError(f"unknown param-group option(s) {sorted(unknown)}; per-group options are "
                             f"{GROUP_KEYS} (curvature options are global: SymoConfig)")
        if "params" not in g:
            raise ValueError("a param group needs a 'params' entry: {'params': [(name, param), ...], ...}")
        items = g["params"]
        if torch.is_tensor(items) or not isinstance(items, (Iterable, Mapping)):
            raise TypeError(f"a param group's 'params' must be [(name, param), ...], got {type(items).__name__}")
        items = list(items.items()) if isinstance(items, Mapping) else list(items)
        for item in items:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise TypeError("Symo needs named parameters: pass model.named_parameters() or groups "
                                "with 'params': [(name, param), ...]")
            if item[0] in seen:
                raise ValueError(f"parameter {item[0]!r} given twice")
            if id(item[1]) in tensors:  # tied weights named twice (named_parameters(remove_duplicate=False))
                raise ValueError(f"parameters {tensors[id(item[1])]!r} and {item[0]!r} are one tensor (tied weights); "
                                 "give it once, e.g. model.named_parameters() as it is (it names a tied tensor "
                                 "once), or it would be stepped twice")
            seen.add(item[0])
            tensors[id(item[1])] = item[0]
        out.append({**g, "params": items})
    return out
