"""The worked cases of docs/theory.md §5 compiled and checked against their closed forms (SVD, the eigh of a Gram
matrix, the normalised gradient): Muon's polar factor, perm rows keeping the mean row apart, the factored gauge's
Gram rule, a hidden-to-hidden matrix, relative damping on single-block layouts, and which labels couple. The
compiled structure against the dense oracles: test_compiler_oracles.py. float64 throughout."""

from __future__ import annotations

import math

import oracles as O
import oracles_dense as OD
import pytest
import torch
from compiler_cases import (
    D,
    S3xS3,
    assert_near,
    compile_text,
    gen,
    mlp_case,
    setup,
)
from helpers import polar

# ---------------------------------------------------------------------------------------------
# The worked cases (docs/theory.md §5) against closed forms
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["signed_perm", "orthogonal"])
@pytest.mark.parametrize("shape", [(7, 3), (5, 5), (3, 8), (4, 2), (3, 3), (2, 4)])
def test_muon_polar_factor(kind: str, shape: tuple[int, int]) -> None:
    """Case 1: w = ["r", "_"] gives S^{-1/2} g = sqrt(m) U V^T (tall, square and wide)."""
    m, n = shape
    compiled = compile_text(f'[spaces]\nr = {{ group = "{kind}" }}\n[params]\n"w" = ["r", "_"]\n', {"w": shape})
    G = torch.randn(m, n, dtype=D, generator=gen(40 + m * n))
    upd = compiled.orbit_average({"w": G}).power(-0.5).matvec({"w": G})["w"]
    assert_near(upd, math.sqrt(m) * polar(G, tol=1e-12))
    if m <= 4:  # and the exhaustive average, for the groups small enough to enumerate
        acts = O.action_matrices({"r": (kind, m, None)}, [("w", shape, ["r", "_"])])
        S = OD.dense_orbit_average(acts, G.reshape(-1))
        assert_near(upd.reshape(-1), OD.dense_power(S, -0.5) @ G.reshape(-1))
        assert_near(S, torch.kron(torch.eye(m, dtype=D), G.T @ G / m))


@pytest.mark.parametrize("shape", [(4, 2), (3, 3), (3, 5), (6, 3)])
def test_muon_with_perm_rows_keeps_the_mean_row_apart(shape: tuple[int, int]) -> None:
    """With perm rows the J/m piece is its own block: sqrt(m-1) polar((I-J/m) G) + mean row / its norm."""
    m, n = shape
    compiled = compile_text('[spaces]\nr = { group = "perm" }\n[params]\n"w" = ["r", "_"]\n', {"w": shape})
    assert len(compiled.blocks) == 2
    G = torch.randn(m, n, dtype=D, generator=gen(50 + m * n))
    upd = compiled.orbit_average({"w": G}).power(-0.5).matvec({"w": G})["w"]
    centered = G - G.mean(0, keepdim=True)
    col_sum = G.sum(0, keepdim=True)
    expected = (math.sqrt(m - 1) * polar(centered, tol=1e-12)
                + torch.ones(m, 1, dtype=D) * col_sum / col_sum.norm() / math.sqrt(m))
    assert_near(upd, expected)
    if m <= 4:
        acts = O.action_matrices({"r": ("perm", m, None)}, [("w", shape, ["r", "_"])])
        S = OD.dense_orbit_average(acts, G.reshape(-1))
        assert_near(upd.reshape(-1), OD.dense_power(S, -0.5) @ G.reshape(-1))


@pytest.mark.parametrize("mnk", [(5, 4, 3), (2, 1, 4), (6, 6, 2)])
def test_factored_gauge_is_gram_determined(mnk: tuple[int, int, int]) -> None:
    """Case 4: U (m x k), V (n x k), shared O(k): S^{-1/2} g = sqrt(k) (Y Y^T)^{-1/2} Y, Y = [G_U; G_V]."""
    m, n, k = mnk
    spec = '[spaces]\nk = { group = "orthogonal" }\n[params]\nU = ["_", "k"]\nV = ["_", "k"]\n'
    compiled = compile_text(spec, {"U": (m, k), "V": (n, k)})
    g = gen(60 + k)
    gu, gv = torch.randn(m, k, dtype=D, generator=g), torch.randn(n, k, dtype=D, generator=g)
    upd = compiled.orbit_average({"U": gu, "V": gv}).power(-0.5).matvec({"U": gu, "V": gv})
    Y = torch.cat([gu, gv])
    expected = math.sqrt(k) * OD.dense_power(Y @ Y.T, -0.5) @ Y
    assert_near(torch.cat([upd["U"], upd["V"]]), expected)
    if k <= 3:
        layout = [("U", (m, k), ["_", "k"]), ("V", (n, k), ["_", "k"])]
        acts = O.action_matrices({"k": ("orthogonal", k, None)}, layout)
        x = torch.cat([gu.reshape(-1), gv.reshape(-1)])
        S = OD.dense_orbit_average(acts, x)
        assert_near(torch.cat([upd["U"].reshape(-1), upd["V"].reshape(-1)]), OD.dense_power(S, -0.5) @ x)


@pytest.mark.parametrize("h2,h1", [(3, 2), (5, 4), (1, 6)])
def test_hidden_to_hidden_signed_is_normalised_gradient(h2: int, h1: int) -> None:
    """Case 3: both spaces signed_perm, S is the scalar ||G||^2 / (h1 h2): sqrt(h1 h2) G / ||G||."""
    spec = '[spaces]\na = { group = "signed_perm" }\nb = { group = "signed_perm" }\n[params]\nW = ["b", "a"]\n'
    compiled = compile_text(spec, {"W": (h2, h1)})
    G = torch.randn(h2, h1, dtype=D, generator=gen(70 + h1))
    cur = compiled.orbit_average({"W": G})
    assert_near(cur.power(-0.5).matvec({"W": G})["W"], math.sqrt(h1 * h2) * G / G.norm())
    assert_near(cur.dense(), torch.eye(h1 * h2, dtype=D) * G.norm() ** 2 / (h1 * h2))


@pytest.mark.parametrize("spec,shapes", [
    ('[spaces]\nr = { group = "signed_perm" }\n[params]\n"w" = ["r", "_"]\n', {"w": (3, 4)}),
    ('[spaces]\nr = { group = "orthogonal" }\n[params]\n"w" = ["r", "_"]\n', {"w": (4, 2)}),
    ('[spaces]\nk = { group = "orthogonal" }\n[params]\nU = ["_", "k"]\nV = ["_", "k"]\n', {"U": (2, 3), "V": (2, 3)}),
    ('[spaces]\na = { group = "signed_perm" }\nb = { group = "orthogonal" }\n[params]\nW = ["b", "a"]\n',
     {"W": (2, 3)}),
], ids=["muon-wide", "muon-tall", "gauge", "hidden-to-hidden"])
@pytest.mark.parametrize("damping", [1e-3, 0.1])
def test_relative_damping_on_single_block_layouts(spec: str, shapes: dict, damping: float) -> None:
    """With one isotypic block, per-block relative damping is the dense oracle's global damping."""
    compiled = compile_text(spec, shapes)
    assert len(compiled.blocks) == 1
    names = compiled.param_names
    g = {n: torch.randn(*s, dtype=D, generator=gen(17 + i)) for i, (n, s) in enumerate(shapes.items())}
    x = OD.flatten(g, names)
    S = compiled.orbit_average(g).dense()
    for p in (-0.5, -1.0):
        expected = OD.dense_power(S, p, damping)
        assert_near(compiled.orbit_average(g).power(p, damping).dense(), expected)
        assert_near(OD.flatten(compiled.orbit_average(g).power(p, damping).matvec(g), names), expected @ x)


def test_curvatures_of_different_specs_do_not_mix() -> None:
    a = compile_text('[spaces]\nr = { group = "perm" }\n[params]\n"w" = ["r", "_"]\n', {"w": (3, 2)})
    b = compile_text('[spaces]\nr = { group = "perm" }\n[params]\n"w" = ["r", "_"]\n', {"w": (3, 3)})
    with pytest.raises(ValueError):
        a.orbit_average({"w": torch.ones(3, 2, dtype=D)}) + b.orbit_average({"w": torch.ones(3, 3, dtype=D)})


def test_s3xs3_label_couples_w1_with_w2_column_means() -> None:
    """The (std_a, triv_b) label holds W1 and the column means of W2."""
    compiled, _ = setup(S3xS3)
    names = {b.name: set(b.params) for b in compiled.blocks}
    assert names == {
        "std(a)": {"W1", "W2"},
        "std(b)": {"W2", "b2", "W3"},
        "std(a) x std(b)": {"W2"},
        "trivial": {"W1", "W2", "b2", "W3"},
    }


def test_shared_hidden_space_is_one_label() -> None:
    """Case 2 with signed_perm: one label stacks [G1^T; g_b1^T; G2]; b2 sits alone in the trivial one."""
    compiled, _ = setup(mlp_case("signed_perm", 3))
    by_params = sorted(sorted(b.params) for b in compiled.blocks)
    assert by_params == [["fc1.bias", "fc1.weight", "fc2.weight"], ["fc2.bias"]]
