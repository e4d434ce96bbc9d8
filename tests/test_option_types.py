"""Every option of every kind, and of every feature config, refuses a value of the wrong type with a message that
names the option (an int option given 2.5, a number given a string, a choice given a number, a flag given 1), and
every choice option a value outside its choices, naming it and listing them."""

from __future__ import annotations

import types
import typing
from dataclasses import fields

import pytest

from symo.optim import SymoConfig
from symo.optim.checks import choice_problem
from symo.optim.config import FEATURES, FLAT
from symo.optim.kinds import KINDS
from symo.optim.matrix_function_configs import MatrixFunction

# options whose annotation is not a plain type (a spec, an inner kind's config, a refresh method): tested with their
# kinds (test_kinds, test_soap, test_bad_input)
SPECIAL = {"geometric_mean_with", "inner", "refresh"}


def is_config(hint: object) -> bool:
    """A matrix-function config class (NewtonSchulz, Eigh, ...)."""
    return isinstance(hint, type) and issubclass(hint, MatrixFunction)


def wrong_values(hint: object) -> list[object]:
    """Values no option annotated `hint` may take."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if is_config(hint):
        return [3, "x"]
    if hint is bool:
        return [1, "yes"]
    if hint is int:
        return [2.5, "10", True]
    if hint is float:
        return ["0.1", None]
    if hint is str:
        return [3]
    if origin is tuple:
        return [("x",) * len(args), 0.9]
    if origin is typing.Literal:
        return [3, None] if all(isinstance(a, str) for a in args) else ["maybe"]
    if origin in (typing.Union, types.UnionType):
        if set(args) == {float, type(None)}:
            return ["0.1"]
        if bool in args and any(typing.get_origin(a) is typing.Literal for a in args):
            return [3]
        if any(is_config(a) for a in args) and any(typing.get_origin(a) is typing.Literal for a in args):
            return [3, None]  # a matrix function: its configs or their string spellings
    return []


CASES = [(owner, cls, f.name, value)
         for owner, cls in [*((k, c) for k, (c, _) in KINDS.items()), *FEATURES.items()]
         for f in fields(cls) if f.name not in SPECIAL
         for value in wrong_values(typing.get_type_hints(cls)[f.name])]


def test_every_option_with_a_plain_type_is_covered():
    covered = {(owner, name) for owner, _, name, _ in CASES}
    for owner, cls in [*((k, c) for k, (c, _) in KINDS.items()), *FEATURES.items()]:
        for f in fields(cls):
            if f.name not in SPECIAL:
                assert (owner, f.name) in covered, (owner, f.name, typing.get_type_hints(cls)[f.name])


@pytest.mark.parametrize("owner,cls,name,value", CASES, ids=[f"{o}.{n}={v!r}" for o, _, n, v in CASES])
def test_a_wrongly_typed_option_is_refused_naming_it(owner, cls, name, value):
    flat = {"lr": "adamw_lr", "betas": "adamw_betas", "eps": "adamw_eps", "weight_decay": "adamw_wd"}
    said = flat.get(name, name) if cls.__name__ == "AdamWConfig" else name
    said = f"distributed_{name}" if cls.__name__ == "DistributedConfig" else said
    with pytest.raises((TypeError, ValueError)) as err:
        cls(**{name: value})
    assert said in str(err.value), str(err.value)


def choices_of(hint: object) -> tuple[object, ...] | None:
    """The values a choice option (a Literal, or a union holding one) may take, read from its annotation; None for
    an option that is not a choice."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if not any(typing.get_origin(m) is typing.Literal for m in members):
        return None
    listed = {bool: (True, False), type(None): (None,)}
    return tuple(c for m in members
                 for c in (typing.get_args(m) if typing.get_origin(m) is typing.Literal else listed.get(m, ())))


def configs_said(hint: object) -> str:
    """What a choice option's message adds for the matrix-function configs its union holds."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    configs = [f"{m.__name__}({'...' if fields(m) else ''})" for m in members if is_config(m)]
    return f" or a config {', '.join(configs)} (symo.optim)" if configs else ""


def choice_options() -> list[tuple[dict, str, tuple[object, ...], str]]:
    """(the SymoConfig keywords that select the option's holder, the option's flat name, its choices, what its
    message adds for configs) for every choice option of every kind (a composing kind's inner kinds' options
    reached through it too, and the flat keywords that set a matrix-function config's choice field) and of every
    feature config."""
    flat_of = {(feature, fld): name for name, (feature, fld) in FLAT.items()}
    out = []
    for feature, cls in FEATURES.items():
        hints = typing.get_type_hints(cls)
        out += [({}, flat_of[feature, f.name], choices_of(hints[f.name]), "") for f in fields(cls)
                if choices_of(hints[f.name]) is not None]
    for kind, (cls, _) in KINDS.items():
        holders = [({"preconditioner": kind}, cls)] + [({"preconditioner": kind, "inner": inner}, type(make()))
                                                        for inner, make in cls.inner_kinds.items()]
        seen = set()
        for select, holder in holders:
            hints = typing.get_type_hints(holder)
            for f in fields(holder):
                if f.name not in seen and choices_of(hints[f.name]) is not None:
                    seen.add(f.name)
                    out.append((select, f.name, choices_of(hints[f.name]), configs_said(hints[f.name])))
            for name, (_, config, attribute) in holder.shortcuts.items():
                hint = typing.get_type_hints(config)[attribute]
                if name not in seen and choices_of(hint) is not None:
                    seen.add(name)
                    out.append((select, name, choices_of(hint), ""))
    return out


CHOICES = choice_options()


def test_the_choice_options_are_found():
    names = {name for _, name, _, _ in CHOICES}
    assert {"update_scale", "batch_blocks", "distributed_mode", "distributed_comm_dtype", "backend", "ns_method",
            "ns_dtype", "statistic", "damping_scope", "first_step", "eps_placement"} <= names, names


@pytest.mark.parametrize("select,name,choices,configs", CHOICES,
                         ids=[f"{s.get('preconditioner', 'feature')}{'+' + s['inner'] if 'inner' in s else ''}.{n}"
                              for s, n, _, _ in CHOICES])
def test_a_value_outside_the_choices_is_refused_listing_them(select, name, choices, configs):
    """Every choice option, found from the annotations (a new one is covered without touching this test), refuses
    a value of its choices' type that is not one of them (ValueError), and a value of another type (TypeError),
    both naming it as the user passes it and listing its choices."""
    listed = ", ".join(repr(c) for c in choices)
    strings = [c for c in choices if isinstance(c, str)]
    assert strings, f"{name}: a choice option without string choices; give this test a wrong choice of their type"
    wrong_choice = "not_a_choice"
    with pytest.raises(ValueError) as err:
        SymoConfig(**select, **{name: wrong_choice})
    assert str(err.value) == f"{name} must be one of {listed}{configs}; got 'not_a_choice'"
    with pytest.raises(TypeError) as err:
        SymoConfig(**select, **{name: 2.5})
    assert str(err.value) == f"{name} must be one of {listed}{configs}; got 2.5"


def test_a_union_holding_choices_takes_a_value_of_any_member():
    """A choice beside a plain type or None (no option has one yet): the value must be of one of the union's members,
    and the message says what each member takes."""
    hint = typing.Union[int, typing.Literal["auto"], None]  # noqa: UP007 (typing.Union, as get_type_hints may give)
    for ok in (3, "auto", None):
        assert choice_problem("n", hint, ok) is None
    wrong = choice_problem("n", hint, "x")
    assert isinstance(wrong, ValueError) and str(wrong) == "n must be an int or one of 'auto', None; got 'x'"
    wrong = choice_problem("n", int | typing.Literal["auto"], 2.5)
    assert isinstance(wrong, TypeError) and str(wrong) == "n must be an int or one of 'auto'; got 2.5"
    assert choice_problem("n", int, "x") is None  # not a choice option: type_problem's


CONFIG_CLASSES = [cls for cls in vars(__import__("symo.optim.matrix_function_configs", fromlist=["x"])).values()
                  if isinstance(cls, type) and issubclass(cls, MatrixFunction) and cls is not MatrixFunction]
CONFIG_CASES = [(cls, f.name, value) for cls in CONFIG_CLASSES for f in fields(cls)
                for value in wrong_values(typing.get_type_hints(cls)[f.name]) or [3]]


def test_every_matrix_function_config_is_swept():
    assert {c.__name__ for c in CONFIG_CLASSES} == {"Auto", "CoupledNewton", "Eigh", "NewtonSchulz", "PowerQR"}


@pytest.mark.parametrize("cls,name,value", CONFIG_CASES, ids=[f"{c.__name__}.{n}={v!r}" for c, n, v in CONFIG_CASES])
def test_a_wrongly_typed_matrix_function_field_is_refused_naming_it(cls, name, value):
    """Every field of every matrix-function config (NewtonSchulz(steps=2.5), Auto(iteration=3), ...) refuses a value
    of the wrong type, naming the field as Class.field."""
    with pytest.raises((TypeError, ValueError)) as err:
        cls(**{name: value})
    assert f"{cls.__name__}.{name}" in str(err.value), str(err.value)
