"""Compile once per template (compiler.templates): the looped code equals the per-layer code.

The reference is the same spec compiled with `templates=False`, which derives every layer on its
own (the path every spec took before, checked against brute-force group enumeration in
tests/test_compiler_oracles.py); a mixed spec is also checked here against the dense orbit
average over every group element (tests/oracles.py, which never sees the spec language).
"""

from __future__ import annotations

import copy
import math

import oracles as O
import oracles_dense as OD
import pytest
import torch
from cases import FAMILY, stack_shapes, train
from symo.compiler import bind as bind_spec
from symo.compiler import compile_spec, find_families, load_spec, parse_spec

import symo
from symo.train.models import GPT, GPTConfig

D = torch.float64
# two families (fc, attn), parameters outside them with trivial rows (embed, head), a layer whose
# attention has no bias (a unit of its own) and a perm space of size 1 (no standard piece)
MIXED = """
[spaces]
"h{i}" = { group = "perm" }
"a{i}" = { group = "perm" }
e = { group = "perm" }
[params]
"embed.weight" = ["e", "_"]
"layers.{i}.fc1.weight" = ["h{i}", "_"]
"layers.{i}.fc2.weight" = ["_", "h{i}"]
"layers.{i}.attn.weight" = ["a{i}", "_"]
"?layers.{i}.attn.bias" = ["a{i}"]
"head.weight" = ["_", "e"]
"""


# a parameter outside the families (fc1.weight) alone in the trivial block, beside a family (fc1.bias and
# fc3.bias, free axes only) whose members add their rows to it
LONE_IN_TRIVIAL = """
[spaces]
h2 = { group = "signed_perm" }
[params]
"fc1.weight" = ["_", "_"]
"fc1.bias" = ["_"]
"fc2.weight" = ["h2", "_"]
"fc2.bias" = ["h2"]
"fc3.weight" = ["_", "h2"]
"fc3.bias" = ["_"]
"""


def mixed_shapes(widths: tuple[int, ...] = (2, 3, 1, 2)) -> dict:
    shapes = {"embed.weight": (2, 2)}
    for i, w in enumerate(widths):
        shapes |= {f"layers.{i}.fc1.weight": (w, 2), f"layers.{i}.fc2.weight": (1, w)}
        shapes[f"layers.{i}.attn.weight"] = (2, 1)
        if i != 1:
            shapes[f"layers.{i}.attn.bias"] = (2,)
    return shapes | {"head.weight": (1, 2)}


def both(text: str, shapes: dict, sizes: dict | None = None) -> tuple[symo.CompiledSpec, symo.CompiledSpec]:
    spec = parse_spec(text, source="<test>") if isinstance(text, str) else text
    looped = symo.CompiledSpec(compile_spec(spec, shapes, sizes=sizes, disk_cache=False))
    per_layer = symo.CompiledSpec(compile_spec(spec, shapes, sizes=sizes, disk_cache=False, templates=False))
    return looped, per_layer


def random(shapes: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*s, dtype=D, generator=g) for k, s in shapes.items()}


def assert_same_results(looped: symo.CompiledSpec, per_layer: symo.CompiledSpec, shapes: dict) -> None:
    """Same blocks (ids, names, sizes, parameters), same coordinates, same S and S^{-1/2} v."""
    assert "for _p, _ids" in looped.source and "for _p" not in per_layer.source  # the two paths differ
    assert looped.key != per_layer.key
    shapes = {k: s for k, s in shapes.items() if k in per_layer.shapes}
    assert [(b.id, b.name, b.batch, b.mult, b.width, b.dim) for b in looped.blocks] == \
           [(b.id, b.name, b.batch, b.mult, b.width, b.dim) for b in per_layer.blocks]
    for a, b in zip(looped.blocks, per_layer.blocks):
        assert set(a.params) == set(b.params), a.id
    g, v = random(shapes, 0), random(shapes, 1)
    ya, yb = looped.gather(g), per_layer.gather(g)
    assert ya.keys() == yb.keys()
    metas = [{b["id"]: b for b in c._gather.__globals__["BLOCKS"]} for c in (looped, per_layer)]
    for b in per_layer.blocks:
        ma, mb = metas[0][b.id], metas[1][b.id]
        assert [ma[k] for k in ("label", "batch_spaces", "dim_expr")] == [mb[k] for k in ("label", "batch_spaces",
                                                                                        "dim_expr")]
        assert ya[b.id].shape == yb[b.id].shape
        if b.name != "trivial":
            torch.testing.assert_close(ya[b.id], yb[b.id], rtol=0, atol=1e-12)
        # every component's rows, where BLOCKS says they are (the trivial block's order may differ)
        ra = {(r["param"], r["block"], r["pieces"]): (r["offset"], r["rows"]) for r in ma["rows"]}
        rb = {(r["param"], r["block"], r["pieces"]): (r["offset"], r["rows"]) for r in mb["rows"]}
        assert ra.keys() == rb.keys() and len(ra) == len(ma["rows"]) == len(mb["rows"])
        assert sorted(o for o, _ in ra.values()) == sorted(o for o, _ in rb.values()) or b.name == "trivial"
        for key, (offset, rows) in ra.items():
            assert rows == rb[key][1]
            torch.testing.assert_close(ya[b.id][:, offset:offset + rows], yb[b.id][:, rb[key][0]:rb[key][0] + rows],
                                       rtol=0, atol=1e-12)
    back = looped.scatter(ya)
    for k in shapes:
        torch.testing.assert_close(back[k], g[k], rtol=0, atol=1e-12)
    sa, sb = looped.orbit_average(g), per_layer.orbit_average(g)
    sva, svb = sa.matvec(v), sb.matvec(v)
    for k in shapes:
        torch.testing.assert_close(sva[k], svb[k], rtol=1e-12, atol=1e-12)
    if sum(math.prod(s) for s in shapes.values()) <= 500:
        torch.testing.assert_close(sa.dense(), sb.dense(), rtol=0, atol=1e-12)
    ma, mb = sa.power(-0.5).matvec(v), sb.power(-0.5).matvec(v)
    for k in shapes:
        torch.testing.assert_close(ma[k], mb[k], rtol=1e-12, atol=1e-12)
    ra, rb = looped.invariant_part(v), per_layer.invariant_part(v)
    for k in shapes:
        torch.testing.assert_close(ra[k], rb[k], rtol=0, atol=1e-12)


@pytest.mark.parametrize("group", ["perm", "signed_perm", "orthogonal"])
def test_family_stack_equals_per_layer_code(group: str) -> None:
    shapes = stack_shapes(5, n=4)
    looped, per_layer = both(FAMILY % group, shapes)
    assert_same_results(looped, per_layer, shapes)


def test_mixed_families_equal_per_layer_code_and_dense_oracle() -> None:
    shapes = mixed_shapes()
    bound = bind_spec(parse_spec(MIXED, source="<test>"), shapes)
    plan = find_families(bound)
    # fc of layers 0, 1, 3 (layer 2's h2 has size 1: no standard piece) with embed + head (the same
    # layout: ["e", "_"] and ["_", "e"]), and attn of layers 0, 2, 3 (layer 1's has no bias)
    assert [f.params[0] for f in plan.families] == [("embed.weight", "head.weight"),
                                                    ("layers.0.attn.weight", "layers.0.attn.bias")]
    assert [len(f.params) for f in plan.families] == [4, 3]
    assert [p.name for p in plan.rest.params] == ["layers.1.attn.weight", "layers.2.fc1.weight",
                                                  "layers.2.fc2.weight"]
    looped, per_layer = both(MIXED, shapes)
    assert_same_results(looped, per_layer, shapes)
    # the trivial block holds rows of every unit: here in another order than the per-layer code's
    trivial = next(b.id for b in looped.blocks if b.name == "trivial")
    g = random(shapes, 2)
    assert not torch.equal(looped.gather(g)[trivial], per_layer.gather(g)[trivial])
    # and the dense orbit average over every element of the group (2 * 2 * 1 * 2 * 2 * 6 * 2 * 2 elements)
    names = list(shapes)
    spaces = {"e": ("perm", 2, None)} | {f"h{i}": ("perm", w, None) for i, w in enumerate((2, 3, 1, 2))}
    spaces |= {f"a{i}": ("perm", 2, None) for i in range(4)}
    layout = [("embed.weight", (2, 2), ["e", "_"])]
    for i, w in enumerate((2, 3, 1, 2)):
        layout += [(f"layers.{i}.fc1.weight", (w, 2), [f"h{i}", "_"]),
                   (f"layers.{i}.fc2.weight", (1, w), ["_", f"h{i}"]),
                   (f"layers.{i}.attn.weight", (2, 1), [f"a{i}", "_"])]
        if i != 1:
            layout.append((f"layers.{i}.attn.bias", (2,), [f"a{i}"]))
    layout.append(("head.weight", (1, 2), ["_", "e"]))
    assert [n for n, _, _ in layout] == names
    actions = O.action_matrices(spaces, layout)
    S = OD.dense_orbit_average(actions, OD.flatten(g, names))
    torch.testing.assert_close(looped.orbit_average(g).dense(), S, rtol=0, atol=1e-10)


def test_gpt_specs_equal_per_layer_code() -> None:
    model = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=3, n_head=2, n_embd=16))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    for name, sizes in (("gpt", {"dqk{i}": 4, "dvo{i}": 4}), ("gpt_muon", None), ("gpt_true", {"head{i}": 2})):
        looped, per_layer = both(load_spec(name), shapes, sizes)
        assert_same_results(looped, per_layer, shapes)


@pytest.mark.parametrize("beta2", [0.0, 0.9])
def test_symo_steps_equal_per_layer_code(beta2: float) -> None:
    """Three optimizer steps in float64 on a 3-layer GPT with perm MLP spaces (a trivial block that
    couples every layer): the same parameters to 1e-12 with either compiled form."""
    text = load_spec("gpt").to_toml().replace('"mlp{i}" = { group = "signed_perm" }', '"mlp{i}" = { group = "perm" }')
    assert '"mlp{i}" = { group = "perm" }' in text
    torch.manual_seed(0)
    base = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, vocab_size=17, block_size=8)).double()
    shapes = {n: tuple(p.shape) for n, p in base.named_parameters()}
    compiled = both(text, shapes, {"dqk{i}": 4, "dvo{i}": 4})
    # per layer: c_fc's 16 columns, its bias, c_proj's 16 rows
    assert [b.mult for b in compiled[0].blocks if b.name == "trivial"] == [3 * 33]
    final = []
    for comp in compiled:
        model = copy.deepcopy(base)
        opt = symo.Symo(model.named_parameters(), comp, preconditioner="root", lr=0.02, beta2=beta2, backend="eigh")
        train(model, opt, steps=3, batch=2, length=8)
        final.append(dict(model.named_parameters()))
    for name, p0 in base.named_parameters():
        update = (final[1][name] - p0).norm()
        assert update > 0, name
        torch.testing.assert_close(final[0][name], final[1][name], rtol=0, atol=1e-12 * max(1.0, update.item()))


def test_a_parameter_alone_in_the_trivial_block_beside_a_family() -> None:
    shapes = {"fc1.weight": (4, 3), "fc1.bias": (4,), "fc2.weight": (5, 4), "fc2.bias": (5,), "fc3.weight": (2, 5),
              "fc3.bias": (2,)}
    looped, per_layer = both(LONE_IN_TRIVIAL, shapes)
    assert_same_results(looped, per_layer, shapes)


def test_template_code_does_not_grow_with_depth() -> None:
    """Apart from the member table (one line per layer), 10 and 40 layers generate the same code (the
    per-layer path grows by the same amount per layer: tests/test_depth_compile.py)."""
    def code(layers: int) -> str:
        source = symo.CompiledSpec(compile_spec(parse_spec(FAMILY % "perm", source="<test>"), stack_shapes(layers),
                                                disk_cache=False)).source
        lines = [x for x in source.splitlines() if not x.startswith(("# Key:", "    '[[", "# family 0:"))]
        return "\n".join(lines)

    assert code(10) == code(40)
    assert len(code(40)) < 6000


def test_one_template_source_serves_other_widths() -> None:
    """Members of different widths share the code; a new width binds the same source again."""
    first = symo.CompiledSpec(compile_spec(parse_spec(MIXED, source="<test>"), mixed_shapes(), disk_cache=False))
    wide = mixed_shapes((4, 3, 1, 5))
    looped, per_layer = both(MIXED, wide)
    assert looped.key == first.key and looped.source == first.source
    assert_same_results(looped, per_layer, wide)


def test_names_never_become_code() -> None:
    """Parameter and space names reach the template module only as repr literals."""
    prefix = "a'];import os;x=['"
    text = FAMILY.replace("layers.{i}", prefix + ".{i}") % "perm"
    shapes = {k.replace("layers.", prefix + "."): s for k, s in stack_shapes(3).items()}
    module = compile_spec(parse_spec(text, source="<test>"), shapes, disk_cache=False)
    assert "for _p, _ids" in module.source and "os" not in module.namespace
    looped, per_layer = both(text, shapes)
    assert_same_results(looped, per_layer, shapes)
