"""Property-based tests (hypothesis) over spec text, names and shapes.

Whatever the input, only the documented exceptions escape: `SpecError` for a spec, `TypeError` or
`ValueError` for API misuse. Whatever is accepted compiles and applies: scatter(gather(t)) == t,
the orbit average is invariant under a random group element (MATH: S(A_g g) = S(g)), and its
powers are finite.
"""

from __future__ import annotations

import json

import torch
from cases import MLP_SPEC
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import symo

DOCUMENTED = (symo.SpecError, TypeError, ValueError)
SETTINGS = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def applies(compiled: symo.CompiledSpec, shapes: dict) -> None:
    event("accepted and applied")
    gen = torch.Generator().manual_seed(0)
    g = {n: torch.randn(s, generator=gen, dtype=torch.float64) for n, s in shapes.items()}
    back = compiled.scatter(compiled.gather(g))
    for n in compiled.param_names:
        torch.testing.assert_close(back[n], g[n])
    s = compiled.orbit_average(g)
    moved = compiled.act(compiled.random_element(gen), g)
    v = {n: torch.randn(shapes[n], generator=gen, dtype=torch.float64) for n in compiled.param_names}
    a, b = s.matvec(v), compiled.orbit_average(moved).matvec(v)
    for n in compiled.param_names:
        torch.testing.assert_close(a[n], b[n], rtol=1e-8, atol=1e-8)
    out = s.power(-0.5, damping=1e-6).matvec(g)
    assert all(torch.isfinite(t).all() for t in out.values())


# ---------------------------------------------------------------------------------------------
# Spec text: fragments of real specs, recombined and corrupted
# ---------------------------------------------------------------------------------------------

FRAGMENTS = ['[spaces]\n', '[params]\n', 'h = "perm"\n', 'h = { group = "signed_perm" }\n',
             '"h{i}" = { group = "orthogonal", per = "o{i}" }\n', 'o = "identity"\n', 'h = { size = 3 }\n',
             '"fc1.weight" = ["h", "_"]\n', '"fc{i}.bias" = ["h{i}"]\n', '"?x" = [["h", "_"]]\n',
             '"fc2.weight" = ["(o h)", "_"]\n', 'name = "n"\n', '"w" = [[[["h"]]]]\n', '= = =\n', '"\\u0000" = 1\n',
             'a = [\n', '}\n', '"fc1.weight" = ["h" , "h"]\n', 'h = { group = "perm", per = "h" }\n',
             '[spaces]\nh = "perm"\n[params]\n"fc1.weight" = ["h", "_"]\n"fc1.bias" = ["h"]\n']  # a whole spec


@SETTINGS
@given(st.one_of(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=10),
                 st.lists(st.sampled_from(FRAGMENTS[-1:] + FRAGMENTS[6:11]), min_size=1, max_size=3)))
def test_spec_text_raises_only_spec_errors(pieces: list[str]) -> None:
    text = "".join(pieces)
    try:
        spec = symo.parse_spec(text)
    except symo.SpecError as err:
        assert err.hint and len(str(err)) < 2000
        return
    shapes = {"fc1.weight": (3, 2), "fc1.bias": (3,), "fc2.weight": (6, 2), "fc2.bias": (2,), "w": (2,), "x": (3,)}
    try:
        compiled = symo.compile(spec, shapes, disk_cache=False)
    except DOCUMENTED:
        return
    applies(compiled, shapes)


# ---------------------------------------------------------------------------------------------
# Names: arbitrary text as parameter names and as spec keys
# ---------------------------------------------------------------------------------------------

NAMES = st.one_of(st.text(alphabet=st.characters(codec="utf-8"), max_size=8),  # anything, mostly refused
                  st.text(alphabet=st.characters(categories=("L", "N", "P", "S")), min_size=1, max_size=8))


@SETTINGS
@given(st.lists(NAMES, min_size=1, max_size=4, unique=True))
def test_arbitrary_names_are_refused_cleanly_or_carried(names: list[str]) -> None:
    shapes = {n: (3, 2) for n in names}
    text = '[spaces]\nh = "signed_perm"\n[params]\n' + "".join(json.dumps(n) + ' = ["h", "_"]\n' for n in names)
    try:
        spec = symo.parse_spec(text)
        compiled = symo.compile(spec, shapes, disk_cache=False)
    except DOCUMENTED:
        return
    assert set(compiled.param_names) == set(names)
    applies(compiled, shapes)


# ---------------------------------------------------------------------------------------------
# Shapes: any Python value where a shape belongs
# ---------------------------------------------------------------------------------------------

DIMS = st.one_of(st.integers(-2, 6), st.floats(allow_nan=True), st.booleans(), st.text(max_size=2), st.none())
SHAPES = st.one_of(st.tuples(DIMS, DIMS), st.tuples(st.integers(0, 6), st.integers(0, 6)),
                   st.lists(st.integers(0, 6), max_size=3), st.text(max_size=3), st.integers(), st.none())


@st.composite
def shape_dicts(draw):
    """Each shape either consistent with a hidden size h or anything at all."""
    h, d = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    good = {"fc1.weight": (h, d), "fc1.bias": [h], "fc2.weight": (d, h)}
    return {n: v if draw(st.booleans()) else draw(SHAPES) for n, v in good.items()}


@SETTINGS
@given(shape_dicts())
def test_arbitrary_shapes_raise_documented_errors(shapes: dict) -> None:
    spec = symo.parse_spec(MLP_SPEC % "perm")
    try:
        compiled = symo.compile(spec, shapes, disk_cache=False)
    except DOCUMENTED:
        return
    applies(compiled, {n: tuple(s) for n, s in shapes.items()})


# ---------------------------------------------------------------------------------------------
# Structured random specs: spaces, products, fused axes and free segments, consistent or not
# ---------------------------------------------------------------------------------------------

GROUPS = ("identity", "perm", "signed_perm", "orthogonal")


@st.composite
def random_specs(draw):
    spaces = {f"s{k}": draw(st.sampled_from(GROUPS)) for k in range(draw(st.integers(1, 3)))}
    sizes = {s: draw(st.integers(1, 3)) for s in spaces}
    rules, shapes = [], {}
    for p in range(draw(st.integers(1, 3))):
        axes, shape = [], []
        for _ in range(draw(st.integers(1, 2))):
            segs = draw(st.lists(st.one_of(st.just(["_"]), st.lists(st.sampled_from(sorted(spaces)), min_size=1,
                                                                    max_size=2, unique=True)), min_size=1, max_size=2))
            length = sum((draw(st.integers(1, 3)) if seg == ["_"] else
                          int(torch.tensor([sizes[x] for x in seg]).prod())) for seg in segs)
            axes.append([seg[0] if len(seg) == 1 else "(" + " ".join(seg) + ")" for seg in segs])
            shape.append(length + draw(st.sampled_from([0, 0, 0, 1])))  # sometimes inconsistent
        rules.append((f"p{p}", axes))
        shapes[f"p{p}"] = tuple(shape)
    text = "[spaces]\n" + "".join(f'{s} = "{g}"\n' for s, g in spaces.items()) + "[params]\n"
    text += "".join(f'"{n}" = {json.dumps(axes)}\n' for n, axes in rules)
    given_sizes = {s: v for s, v in sizes.items() if draw(st.booleans())}
    return text, shapes, given_sizes


@settings(max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_specs())
def test_random_specs_compile_and_apply_or_raise_spec_errors(case) -> None:
    text, shapes, given_sizes = case
    spec = symo.parse_spec(text)
    try:
        compiled = symo.compile(spec, shapes, sizes=given_sizes or None, disk_cache=False)
    except symo.SpecError as err:
        assert err.hint and err.file == "<string>"
        return
    assume(compiled.param_names)
    applies(compiled, shapes)
