"""Heads permuted as wholes, the curvature: the orbit average of a `per` space under a perm (or signed_perm) owner
against the group enumerated, a family of layers pooled as layer by layer, and the optimizer's equivariance.

Each test keeps its own reference: the group action written out per head and the orbit average by enumerating the
group (the model: tests/attention_cases.py; the group action and alignment: test_head_permutations.py)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from attention_cases import D_HEAD, Attention, attention, inputs, spec_text
from symo.compiler import compile_spec
from torch import nn

import symo
from symo.runtime.compiled import CompiledSpec

pytestmark = pytest.mark.usefixtures("one_thread_module")


# ---------------------------------------------------------------------------------------------- the curvature
def brute_orbit_average(vectors: list[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack(vectors)
    return stacked.T @ stacked / len(vectors)


def signed_perms(n: int) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """B_n as (permutation, signs): x'_i = s_i x_pi(i). On R^n its commutant is O(n)'s (the scalars), so it
    stands in for Haar O(n) in an orbit average (docs/theory.md)."""
    return [(p, torch.tensor(s, dtype=torch.float64)) for p in itertools.permutations(range(n))
            for s in itertools.product((1.0, -1.0), repeat=n)]


def matrix(perm: tuple[int, ...], signs: torch.Tensor) -> torch.Tensor:
    return torch.eye(len(perm), dtype=torch.float64)[list(perm)] * signs.unsqueeze(1)


CURVATURE_A = '''[spaces]
head = { group = "perm" }
dqk = { group = "orthogonal", per = "head" }

[params]
"q" = ["(head dqk)", "_"]
"k" = ["(head dqk)", "_"]
"g" = ["head"]
'''


REPEATED_HEAD = '"m" = ["head", "head"]\n'  # a head-to-head matrix: the owner twice (compiler.repeated)


@pytest.mark.parametrize("repeated", [False, True], ids=["single", "head twice"])
def test_orbit_average_of_heads_permuted_with_their_rotations_against_enumeration(repeated: bool) -> None:
    """S_3 wreath O(2): q, k rows (head dqk) and a per-head gain g (the owner alone: its trivial and standard
    pieces); `repeated` adds m (head x head), moved as P m P^T, which compiles through compiler.repeated. The
    compiled S equals the average over every element (O(2) by its stand-in B_2), and commutes with Haar
    elements."""
    n, k, d = 3, 2, 3
    shapes = {"q": (n * k, d), "k": (n * k, d), "g": (n,)} | ({"m": (n, n)} if repeated else {})
    text = CURVATURE_A + (REPEATED_HEAD if repeated else "")
    compiled = symo.compile(symo.parse_spec(text), shapes, sizes={"head": n})
    assert {b.name for b in compiled.blocks} == ({"ind(head) x nat(dqk)", "std(head)", "trivial"}
                                                 | ({"alt(head)"} if repeated else set()))
    gen = torch.Generator().manual_seed(0)
    grads = {name: torch.randn(shape, dtype=torch.float64, generator=gen) for name, shape in shapes.items()}
    rotations = [matrix(*e) for e in signed_perms(k)]
    vectors = []
    for pi in itertools.permutations(range(n)):
        idx = list(pi)
        for rs in itertools.product(rotations, repeat=n):
            r = torch.stack(rs)
            q, kk = (torch.einsum("hij,hjd->hid", r, grads[x].view(n, k, d)[idx]) for x in ("q", "k"))
            mixed = [grads["m"][idx][:, idx].reshape(-1)] if repeated else []
            vectors.append(torch.cat([q.reshape(-1), kk.reshape(-1), grads["g"][idx], *mixed]))
    expected = brute_orbit_average(vectors)
    got = compiled.orbit_average(grads).dense()
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
    # the per-head blocks pooled: not the statistic with heads kept in place (identity owner)
    kept_spec = symo.parse_spec(text.replace('head = { group = "perm" }', 'head = { group = "identity" }'))
    kept = symo.compile(kept_spec, shapes, sizes={"head": n})
    assert float((kept.orbit_average(grads).dense() - expected).abs().max()) > 1e-3
    _assert_commutes_with_haar(compiled, got, shapes)


CURVATURE_B = '''[spaces]
head = { group = "signed_perm" }
dqk = { group = "orthogonal", per = "head" }
dvo = { group = "perm", per = "head" }

[params]
"q" = ["(head dqk)", "_"]
"k" = ["(head dqk)", "_"]
"v" = ["(head dvo)", "_"]
"o" = ["_", "(head dvo)"]
"g" = ["head"]
'''


@pytest.mark.parametrize("repeated", [False, True], ids=["single", "head twice"])
def test_orbit_average_of_signed_heads_with_rotations_and_unit_permutations_against_enumeration(
        repeated: bool) -> None:
    """A signed_perm owner of 2 heads, an O(2) per head on q, k and a per-head permutation of 3 value units on
    v's rows and o's columns (its trivial piece meets the owner's own piece, as g does; its standard piece is
    induced over the heads); `repeated` adds m (head x head), moved as (S P) m (S P)^T."""
    n, k, m, d = 2, 2, 3, 3
    shapes = {"q": (n * k, d), "k": (n * k, d), "v": (n * m, d), "o": (d, n * m), "g": (n,)}
    shapes |= {"m": (n, n)} if repeated else {}
    compiled = symo.compile(symo.parse_spec(CURVATURE_B + (REPEATED_HEAD if repeated else "")), shapes,
                            sizes={"head": n})
    assert {b.name for b in compiled.blocks} == ({"ind(head) x nat(dqk)", "ind(head) x std(dvo)", "nat(head)"} | (
        {"trivial", "diag(head)", "sym(head)", "alt(head)"} if repeated else set()))
    gen = torch.Generator().manual_seed(1)
    grads = {name: torch.randn(shape, dtype=torch.float64, generator=gen) for name, shape in shapes.items()}
    rotations = [matrix(*e) for e in signed_perms(k)]
    units = [torch.eye(m, dtype=torch.float64)[list(p)] for p in itertools.permutations(range(m))]
    q0, k0, v0 = (grads[x].view(n, -1, d) for x in ("q", "k", "v"))
    o0 = grads["o"].view(d, n, m).transpose(0, 1)  # (head, d, dvo)
    vectors = []
    for pi in itertools.permutations(range(n)):
        idx = list(pi)
        for signs in itertools.product((1.0, -1.0), repeat=n):
            s = torch.tensor(signs, dtype=torch.float64)
            for rs in itertools.product(rotations, repeat=n):
                r = torch.stack(rs) * s.view(n, 1, 1)
                q, kk = (torch.einsum("hij,hjd->hid", r, x[idx]) for x in (q0, k0))
                for ps in itertools.product(units, repeat=n):
                    p = torch.stack(ps) * s.view(n, 1, 1)
                    v = torch.einsum("hij,hjd->hid", p, v0[idx])
                    o = torch.einsum("hej,hij->hei", o0[idx], p)  # columns moved by P: o P^T
                    mixed = [(s[:, None] * s[None, :] * grads["m"][idx][:, idx]).reshape(-1)] if repeated else []
                    vectors.append(torch.cat([q.reshape(-1), kk.reshape(-1), v.reshape(-1),
                                              o.transpose(0, 1).reshape(-1), s * grads["g"][idx], *mixed]))
    assert len(vectors) == math.factorial(n) * 2 ** n * 8 ** n * 6 ** n
    expected = brute_orbit_average(vectors)
    got = compiled.orbit_average(grads).dense()
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-10)
    _assert_commutes_with_haar(compiled, got, shapes)


def _assert_commutes_with_haar(compiled: CompiledSpec, s: torch.Tensor, shapes: dict) -> None:
    """A_g S A_g^T = S for random (Haar) elements, A_g built column by column from `act`."""
    sizes = [math.prod(shape) for shape in shapes.values()]
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        element = compiled.random_element(gen)
        columns = []
        for e in torch.eye(sum(sizes), dtype=torch.float64):
            parts = dict(zip(shapes, (x.view(shape) for x, shape in zip(e.split(sizes), shapes.values()))))
            moved = compiled.act(element, parts)
            columns.append(torch.cat([moved[name].reshape(-1) for name in shapes]))
        a = torch.stack(columns, 1)
        torch.testing.assert_close(a @ s @ a.T, s, atol=1e-12, rtol=1e-10)


FAMILY = f'''[spaces]
"head{{i}}" = {{ group = "perm" }}
"dqk{{i}}"  = {{ group = "orthogonal", per = "head{{i}}", size = {D_HEAD} }}
"dvo{{i}}"  = {{ group = "orthogonal", per = "head{{i}}", size = {D_HEAD} }}
"mlp{{i}}"  = {{ group = "perm" }}

[params]
"l.{{i}}.q.weight"   = ["(head{{i}} dqk{{i}})", "_"]
"l.{{i}}.k.weight"   = ["(head{{i}} dqk{{i}})", "_"]
"l.{{i}}.v.weight"   = ["(head{{i}} dvo{{i}})", "_"]
"l.{{i}}.o.weight"   = ["_", "(head{{i}} dvo{{i}})"]
"l.{{i}}.fc1.weight" = ["mlp{{i}}", "_"]
"l.{{i}}.fc2.weight" = ["_", "mlp{{i}}"]
'''


def test_a_family_of_layers_compiles_the_pooled_heads_as_layer_by_layer() -> None:
    """Two layers (`{i}`) are one family: the loop's generated code gives the per-layer code's S."""
    model = nn.ModuleDict({"l": nn.ModuleList([Attention(), Attention()])}).double()
    spec = symo.parse_spec(FAMILY)
    looped = CompiledSpec(compile_spec(spec, model, disk_cache=False, templates=True))
    plain = CompiledSpec(compile_spec(spec, model, disk_cache=False, templates=False))
    assert "families of identical layers" in looped.source and "families of identical layers" not in plain.source
    grads = {n: torch.randn_like(p) for n, p in model.named_parameters() if n in plain.shapes}
    torch.testing.assert_close(looped.orbit_average(grads).dense(), plain.orbit_average(grads).dense(),
                               atol=1e-12, rtol=0)
    names = [b.name for b in plain.blocks]
    assert names.count("ind(head0) x nat(dqk0)") == 1 and names.count("ind(head1) x nat(dvo1)") == 1


def test_the_optimizer_steps_with_heads_permuted_and_stays_equivariant() -> None:
    model, x = attention(0), inputs()
    compiled = symo.compile(symo.parse_spec(spec_text()), model)

    def loss(m: nn.Module) -> torch.Tensor:
        return m(x).pow(2).mean()

    for preset in ("notebook", "default"):  # the orbit-averaged curvature's S^-1/2, and Symo's defaults
        options = {"preset": "notebook"} if preset == "notebook" else {}

        def make(ps, options: dict = options) -> symo.Symo:
            return symo.Symo(ps, compiled, lr=1e-3, **options)

        report = symo.check_equivariance(make, model, compiled, loss, steps=3)
        assert report.is_symmetry and report.is_equivariant, (preset, report.summary())
        assert report.first_step_defect < 1e-14, (preset, report.divergence)
