"""Every option of every kind, and of every feature config, refuses a value of the wrong type with a message that
names the option (an int option given 2.5, a number given a string, a choice given a number, a flag given 1)."""

from __future__ import annotations

import typing
from dataclasses import fields

import pytest

from symo.optim.config import FEATURES
from symo.optim.kinds import KINDS

# options whose annotation is not a plain type (a spec, an inner kind's config, a refresh method): tested with their
# kinds (test_kinds, test_soap, test_bad_input)
SPECIAL = {"geometric_mean_with", "inner", "refresh"}


def wrong_values(hint: object) -> list[object]:
    """Values no option annotated `hint` may take."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
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
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        if set(args) == {float, type(None)}:
            return ["0.1"]
        if bool in args and any(typing.get_origin(a) is typing.Literal for a in args):
            return [3]
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
