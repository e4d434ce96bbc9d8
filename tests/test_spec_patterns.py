"""Spec patterns the other tests never exercise, and the SpecError raise sites they leave out.

- `?` optional rules against a model that lacks the optional parameter (and one that has it);
- the `*` wildcard, which stays inside one dotted component;
- a capture used twice in one pattern, which must match the same text both times.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import symo
from symo.train.models import MLP

SPECS = Path(__file__).resolve().parent.parent / "specs"


def compile_text(text: str, shapes: dict, **kwargs) -> symo.CompiledSpec:
    return symo.compile(symo.parse_spec(text, source="inline.toml"), shapes, disk_cache=False, **kwargs)


OPTIONAL = """
[spaces]
h = "signed_perm"
[params]
"fc1.weight" = ["h", "_"]
"?fc1.bias" = ["h"]
"fc2.weight" = ["_", "h"]
"""


def test_optional_rule_with_and_without_the_parameter():
    """A bias-free model compiles (the `?` rule matches nothing); with biases, the rule couples fc1.bias to
    W1's rows, exactly as a plain rule would; the same rule without `?` rejects the bias-free model."""
    bias_free = {n: tuple(p.shape) for n, p in MLP((4, 5, 3), bias=False).named_parameters()}
    with_bias = {n: tuple(p.shape) for n, p in MLP((4, 5, 3)).named_parameters()}
    c = compile_text(OPTIONAL, bias_free)
    assert c.param_names == ["fc1.weight", "fc2.weight"] and not c.uncovered
    c = compile_text(OPTIONAL, with_bias)
    assert c.param_names == ["fc1.weight", "fc1.bias", "fc2.weight"] and list(c.uncovered) == ["fc2.bias"]
    plain = compile_text(OPTIONAL.replace('"?fc1.bias"', '"fc1.bias"'), with_bias)
    assert [(b.mult, b.width, b.params) for b in c.blocks] == [(b.mult, b.width, b.params) for b in plain.blocks]
    assert ("fc1.bias" in c.blocks[0].params) and c.blocks[0].mult == 4 + 1 + 3
    with pytest.raises(symo.SpecError, match="matches no parameter") as info:
        compile_text(OPTIONAL.replace('"?fc1.bias"', '"fc1.bias"'), bias_free)
    assert info.value.key == "params.'fc1.bias'"


def test_optional_rule_in_the_optimizer_on_a_bias_free_model():
    """Symo with an optional-bias spec on a bias-free model: every weight preconditioned, no AdamW."""
    model = MLP((4, 5, 3), bias=False).double()
    opt = symo.Symo(model.named_parameters(), symo.parse_spec(OPTIONAL), lr=0.1)
    assert set(opt.assignment.values()) == {"symo"}
    model(torch.randn(6, 4, dtype=torch.float64)).square().sum().backward()
    before = model.fc1.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model.fc1.weight)


def test_wildcard_matches_within_one_component():
    """`*` matches any text inside one dotted component, never across a dot; `{x}` captures likewise."""
    text = '[spaces]\n"h" = "signed_perm"\n[params]\n"enc.*.weight" = ["h", "_"]\n'
    shapes = {"enc.a.weight": (3, 2), "enc.bb.weight": (3, 4), "enc.a.b.weight": (3, 5),
              "dec.a.weight": (3, 2), "enc.a.bias": (3,)}
    c = compile_text(text, shapes)
    assert c.param_names == ["enc.a.weight", "enc.bb.weight"]
    assert sorted(c.uncovered) == ["dec.a.weight", "enc.a.b.weight", "enc.a.bias"]
    # a wildcard inside a component, with literal text around it
    text = '[spaces]\n"h" = "signed_perm"\n[params]\n"fc*x.weight" = ["h", "_"]\n'
    c = compile_text(text, {"fc1x.weight": (3, 2), "fcx.weight": (3, 2), "fc1y.weight": (3, 2),
                            "fc.1x.weight": (3, 2)})
    assert c.param_names == ["fc1x.weight", "fcx.weight"]


def test_repeated_capture_must_match_the_same_text():
    """"blocks.{i}.fc{i}.weight" matches blocks.1.fc1 and blocks.2.fc2, not blocks.1.fc2; each layer gets
    its own space h{i}, so the two matched weights form two separate blocks."""
    text = '[spaces]\n"h{i}" = "signed_perm"\n[params]\n"blocks.{i}.fc{i}.weight" = ["h{i}", "_"]\n'
    shapes = {"blocks.1.fc1.weight": (3, 2), "blocks.1.fc2.weight": (3, 2), "blocks.2.fc2.weight": (4, 2),
              "blocks.12.fc12.weight": (5, 2), "blocks.1.fc12.weight": (3, 2)}
    c = compile_text(text, shapes)
    assert c.param_names == ["blocks.1.fc1.weight", "blocks.2.fc2.weight", "blocks.12.fc12.weight"]
    assert sorted(c.spaces) == ["h1", "h12", "h2"]
    assert sorted(c.uncovered) == ["blocks.1.fc12.weight", "blocks.1.fc2.weight"]
    assert sorted(b.width for b in c.blocks) == [3, 4, 5]


GOOD = '[spaces]\nh = "perm"\n[params]\n"fc1.bias" = ["h"]\n'
SHAPES = {"fc1.weight": (3, 2), "fc1.bias": (3,)}

# the raise sites no other test reaches: (id, spec text, shapes, sizes, key, words)
UNTESTED_SITES = [
    ("name-not-a-string", "name = 3\n" + GOOD, SHAPES, None, "name", ("must be a one-line string",)),
    ("spaces-not-a-table", 'spaces = 3\n[params]\n"fc1.bias" = ["_"]\n', SHAPES, None, "spaces", ("must be a table",)),
    ("params-a-list", 'params = ["fc1.bias"]\n', SHAPES, None, "params", ("must be a table",)),
    ("bad-space-name", '[spaces]\n"h-1" = "perm"\n[params]\n"fc1.bias" = ["_"]\n', SHAPES, None, "spaces.h-1",
     ("not a valid space name",)),
    ("free-as-space-name", '[spaces]\n"_" = "perm"\n[params]\n"fc1.bias" = ["_"]\n', SHAPES, None, "spaces._",
     ("not a valid space name",)),
    ("space-not-a-table", '[spaces]\nh = 3\n[params]\n"fc1.bias" = ["h"]\n', SHAPES, None, "spaces.h",
     ("table or a group name",)),
    ("per-not-a-name", '[spaces]\nh = { group = "orthogonal", per = 3 }\n[params]\n"fc1.bias" = ["h"]\n', SHAPES,
     None, "spaces.h.per", ("per must name another space",)),
    ("empty-fused-axis", '[spaces]\nh = "perm"\n[params]\n"fc1.weight" = [[], "_"]\n', SHAPES, None,
     "params.'fc1.weight'", ("at least one segment",)),
    ("empty-product", '[spaces]\nh = "perm"\n[params]\n"fc1.weight" = ["()", "_"]\n', SHAPES, None,
     "params.'fc1.weight'", ("empty product",)),
    ("atom-not-a-name", '[spaces]\nh = "perm"\n[params]\n"fc1.weight" = ["h-1", "_"]\n', SHAPES, None,
     "params.'fc1.weight'", ("'h-1' is not a space name",)),
    ("owner-is-itself-per",
     '[spaces]\nx = { group = "identity", size = 1 }\nhead = { group = "identity", size = 2, per = "x" }\n'
     'd = { group = "orthogonal", per = "head" }\n[params]\n"fc1.weight" = ["(x head d)", "_"]\n',
     {"fc1.weight": (4, 2)}, None, "spaces.d.per", ("itself declared per another space",)),
    ("sizes-not-positive", GOOD, SHAPES, {"h": 0}, "spaces.h", ("positive integer", "0")),
]


@pytest.mark.parametrize("text,shapes,sizes,key,words", [c[1:] for c in UNTESTED_SITES],
                         ids=[c[0] for c in UNTESTED_SITES])
def test_spec_error_sites(tmp_path, text, shapes, sizes, key, words):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    with pytest.raises(symo.SpecError) as info:
        symo.compile(path, shapes, sizes=sizes, disk_cache=False)
    err, message = info.value, str(info.value)
    assert err.file == str(path) and str(path) in message
    assert err.key == key, message
    for word in words:
        assert word in message, (word, message)
    assert err.hint and message.rstrip().endswith(err.hint.rstrip())


def test_size_of_wrong_type_is_a_type_error_naming_the_space():
    # a float size is API misuse (not a spec error): TypeError naming the sizes entry, as torch does
    with pytest.raises(TypeError, match=r"sizes\['h'\] must be an int, got float"):
        symo.compile(symo.parse_spec(GOOD), SHAPES, sizes={"h": 2.5}, disk_cache=False)
