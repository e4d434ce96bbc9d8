"""Deep `{i}` stacks: the running row offsets serve every depth and match the oracle.

Row offsets of a block that couples every layer (the trivial pieces of `perm` hidden spaces) are
emitted as running sums (`_oL0_k = _oL0_{k-1} + rows`), not as sums over all earlier components.
Checked here: a 3-layer `{i}` family equals the dense float64 orbit average over every group element
(tests/oracles.py, which never sees the spec language), the `{i}` template gives the same curvature
as the same layers written out one by one, and the generated source grows linearly with depth.
"""

from __future__ import annotations

import re

import oracles as O
import oracles_dense as OD
import torch
from cases import FAMILY, stack_shapes
from symo.compiler import compile_spec

import symo

D = torch.float64


def explicit_spec(layers: int, group: str) -> str:
    """The same layers, one space and three rules per layer, no `{i}`."""
    lines = ["[spaces]"] + [f'h{i} = {{ group = "{group}" }}' for i in range(layers)] + ["[params]"]
    for i in range(layers):
        lines += [f'"layers.{i}.fc1.weight" = ["h{i}", "_"]', f'"layers.{i}.fc1.bias" = ["h{i}"]',
                  f'"layers.{i}.fc2.weight" = ["_", "h{i}"]']
    return "\n".join(lines) + "\n"


def compile_text(text: str, shapes: dict) -> symo.CompiledSpec:
    return symo.compile(symo.parse_spec(text, source="<test>"), shapes, disk_cache=False)


def random(shapes: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*s, dtype=D, generator=g) for k, s in shapes.items()}


def test_three_layer_perm_family_matches_dense_orbit_average() -> None:
    shapes = stack_shapes(3)
    compiled = compile_text(FAMILY % "perm", shapes)
    names = list(shapes)
    spaces = {f"h{i}": ("perm", 3, None) for i in range(3)}
    layout = []
    for i in range(3):
        layout += [(f"layers.{i}.fc1.weight", (3, 2), [f"h{i}", "_"]), (f"layers.{i}.fc1.bias", (3,), [f"h{i}"]),
                   (f"layers.{i}.fc2.weight", (2, 3), ["_", f"h{i}"])]
    actions = O.action_matrices(spaces, layout)  # 6^3 elements
    g = random(shapes, 0)
    S = OD.dense_orbit_average(actions, OD.flatten(g, names))
    cur = compiled.orbit_average(g)
    torch.testing.assert_close(cur.dense(), S, rtol=0, atol=1e-10)
    v = random(shapes, 1)
    torch.testing.assert_close(OD.flatten(cur.matvec(v), names), S @ OD.flatten(v, names), rtol=0, atol=1e-10)
    # the trivial block couples all layers: per layer fc1's 2 columns, the bias, fc2's 2 rows
    trivial = [b for b in compiled.blocks if b.name == "trivial"]
    assert len(trivial) == 1 and trivial[0].mult == 3 * (2 + 1 + 2)


def test_template_equals_per_layer_spec() -> None:
    shapes = stack_shapes(5, n=4)
    g, v = random(shapes, 2), random(shapes, 3)
    for group in ("perm", "signed_perm"):
        family = compile_text(FAMILY % group, shapes)
        explicit = compile_text(explicit_spec(5, group), shapes)
        a, b = family.orbit_average(g), explicit.orbit_average(g)
        ma, mb = a.power(-0.5).matvec(v), b.power(-0.5).matvec(v)
        for k in shapes:
            torch.testing.assert_close(ma[k], mb[k], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a.dense(), b.dense(), rtol=0, atol=1e-10)


def test_source_grows_linearly_with_depth() -> None:
    """Each extra layer adds the same amount of source: no offset is a sum over earlier layers. (The
    per-layer path, `templates=False`; the default loops over layers: tests/test_templates.py.)"""
    def source(layers: int) -> str:
        return compile_spec(symo.parse_spec(FAMILY % "perm", source="<test>"), stack_shapes(layers),
                            disk_cache=False, templates=False).source

    sizes = [len(source(k)) for k in (10, 20, 40)]
    step1, step2 = sizes[1] - sizes[0], (sizes[2] - sizes[1]) / 2
    assert abs(step2 - step1) / step1 < 0.1, sizes
    # 3 trivial components a layer (the 119th follows a bias: 1 row), each offset on the last
    assert re.search(r"\n_oL\d+_119 = _oL\d+_118 \+ 1\n", source(40))
