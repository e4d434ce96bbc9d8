"""The compiled structure (docs/theory.md §3) against independent dense oracles (tests/oracles.py).

Every case (tests/compiler_cases.py) is written twice: once as a spec (what the library compiles) and once
as an oracle layout (``tests/oracles.py``'s own description, which never goes through the spec language). The
library's factored curvature is then compared with the brute-force average over every group element
(exhaustive for n <= 4; ``orthogonal`` spaces through B_n, whose second moment is exactly Haar's),
and the worked cases of §4 with their closed forms (SVD, eigh of a Gram matrix). float64 throughout.
"""

from __future__ import annotations

import math

import oracles as O
import pytest
import torch
from compiler_cases import (
    CASE_IDS,
    CASES,
    Case,
    D,
    S3xS3,
    assert_near,
    case_S,
    compile_text,
    flat,
    gen,
    grads,
    mlp_case,
    power_tol,
    setup,
    to_oracle_element,
    unflat,
)
from helpers import polar
from torch.func import functional_call

import symo
from symo.train.models import GPT, MLP, GPTConfig

# ---------------------------------------------------------------------------------------------
# The layout itself
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_param_names_uncovered_and_block_count(case: Case) -> None:
    compiled, _ = setup(case)
    assert compiled.param_names == case.names
    covered = set(case.names)
    assert list(compiled.uncovered) == [n for n, _ in case.shapes if n not in covered]
    if case.n_blocks is not None:
        assert len(compiled.blocks) == case.n_blocks


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_act_matches_oracle_action_matrix(case: Case) -> None:
    """compiled.act(g, .) is the oracle's A_g for the same element (uncovered tensors pass through)."""
    compiled, _ = setup(case)
    element = compiled.random_element(gen(11), dtype=D)
    w = grads(case, 12)
    moved = compiled.act(element, w)
    a = O.action_matrix(case.oracle_spaces, list(case.layout), to_oracle_element(compiled, element))
    assert_near(flat(case, moved), a @ flat(case, w))
    for name in compiled.uncovered:
        assert torch.equal(moved[name], w[name])


# ---------------------------------------------------------------------------------------------
# S_g against the exhaustive average
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_dense_and_matvec_match_oracle(case: Case) -> None:
    compiled, _ = setup(case)
    g = grads(case, 1)
    S = case_S(case, g)
    cur = compiled.orbit_average(g)
    assert_near(cur.dense(), S)
    v = grads(case, 2)
    assert_near(flat(case, cur.matvec(v)), S @ flat(case, v))


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_powers_match_oracle(case: Case, seed: int) -> None:
    compiled, _ = setup(case)
    g = grads(case, seed)
    S = case_S(case, g)
    cur = compiled.orbit_average(g)
    tol = power_tol(S)
    inv_sqrt = O.dense_power(S, -0.5)
    assert_near(cur.power(-0.5).dense(), inv_sqrt, tol)
    assert_near(flat(case, cur.power(-0.5).matvec(g)), inv_sqrt @ flat(case, g), tol)
    assert_near(cur.power(2).dense(), S @ S)
    assert_near(cur.power(0.5).dense(), O.dense_power(S, 0.5), tol)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_centered_average_and_invariant_part(case: Case) -> None:
    compiled, actions = setup(case)
    g = grads(case, 5)
    x = flat(case, g)
    r1 = O.dense_R1(actions, x)
    assert_near(flat(case, compiled.invariant_part(g)), r1)
    expected = O.dense_orbit_average(actions, x - r1)
    assert_near(compiled.orbit_average(g, centered=True).dense(), expected)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_zero_and_partly_zero_gradients(case: Case) -> None:
    """Pseudo-inverse semantics: S = 0 gives S^{-1/2} = 0; a gradient on one parameter only works too."""
    compiled, _ = setup(case)
    zero = {n: torch.zeros(*s, dtype=D) for n, s in case.shapes}
    cur = compiled.orbit_average(zero)
    P = O.param_size(case.layout)
    assert_near(cur.dense(), torch.zeros(P, P, dtype=D))
    assert_near(cur.power(-0.5).dense(), torch.zeros(P, P, dtype=D))
    one = dict(zero)
    last = case.names[-1]
    one[last] = grads(case, 15)[last]
    S = case_S(case, one)
    cur = compiled.orbit_average(one)
    assert_near(cur.dense(), S)
    assert_near(cur.power(-0.5).dense(), O.dense_power(S, -0.5), power_tol(S))


# ---------------------------------------------------------------------------------------------
# Invariance
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_average_invariant_under_library_elements(case: Case) -> None:
    compiled, _ = setup(case)
    g = grads(case, 6)
    base = compiled.orbit_average(g).dense()
    for seed in (21, 22):
        moved = compiled.act(compiled.random_element(gen(seed), dtype=D), g)
        assert_near(compiled.orbit_average(moved).dense(), base)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_average_invariant_under_oracle_samples_and_commutes(case: Case) -> None:
    """orbit_average(A g) == orbit_average(g) and A S A^T == S, A from the oracle (Haar for O(n))."""
    compiled, _ = setup(case)
    g = grads(case, 7)
    cur = compiled.orbit_average(g)
    S = cur.dense()
    for seed in (31, 32):
        a = O.sample_action(case.oracle_spaces, list(case.layout), gen(seed))
        moved = unflat(case, a @ flat(case, g))
        assert_near(compiled.orbit_average(moved).dense(), S)
        assert_near(a @ S, S @ a)
        assert_near(a @ cur.power(-0.5).dense(), cur.power(-0.5).dense() @ a)


# ---------------------------------------------------------------------------------------------
# Algebra
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_power_composition_and_support_projector(case: Case) -> None:
    compiled, _ = setup(case)
    g = grads(case, 8)
    S_or = case_S(case, g)
    cur = compiled.orbit_average(g)
    tol = power_tol(S_or)
    pinv = O.dense_power(S_or, -1.0)
    assert_near(cur.power(-0.5).power(2).dense(), pinv, 10 * tol)
    assert_near(cur.power(-1.0).dense(), pinv, 10 * tol)
    assert_near(cur.power(0.5).power(-2).dense(), pinv, 10 * tol)
    assert_near(cur.power(2).power(0.25).dense(), O.dense_power(S_or, 0.5), tol)
    m = cur.power(-0.5).dense()
    projector = O.dense_power(S_or, 0.0)  # 1 on the support, 0 off it
    assert_near(m @ m @ cur.dense(), projector, 10 * tol)
    assert_near(cur.power(-0.5).power(2).dense() @ cur.dense(), projector, 10 * tol)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_sums_and_scalars(case: Case) -> None:
    compiled, _ = setup(case)
    g, h = grads(case, 9), grads(case, 10)
    S, T = compiled.orbit_average(g), compiled.orbit_average(h)
    So, To = case_S(case, g), case_S(case, h)
    assert_near((S + 0.5 * T).dense(), S.dense() + 0.5 * T.dense())
    assert_near((S + 0.5 * T).dense(), So + 0.5 * To)
    assert_near((S * 2.0 - T).dense(), 2 * So - To)
    assert_near((S + T).power(-0.5).dense(), O.dense_power(So + To, -0.5), power_tol(So + To))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_ema_of_many_root_form_curvatures(case: Case) -> None:
    """An EMA over steps: sums of low-rank roots turn dense once their rank would reach mult."""
    compiled, _ = setup(case)
    beta, steps = 0.9, 12
    acc, expected = compiled.zeros(), torch.zeros(O.param_size(case.layout), O.param_size(case.layout), dtype=D)
    first = compiled.orbit_average(grads(case, 100))
    for k in range(steps):
        g = grads(case, 100 + k)
        acc = acc * beta + compiled.orbit_average(g) * (1 - beta)
        expected = beta * expected + (1 - beta) * case_S(case, g)
        assert_near(acc.dense(), expected)
    assert_near(acc.power(-0.5).dense(), O.dense_power(expected, -0.5), power_tol(expected))
    info = {b.id: b for b in compiled.blocks}
    for b in first.root_factors:  # roots stay thinner than the block; enough of them turn dense
        assert b in acc.dense_factors or acc.root_factors[b].shape[-1] < info[b].mult
        if steps * info[b].width >= info[b].mult:
            assert b in acc.dense_factors, b


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
        S = O.dense_orbit_average(acts, G.reshape(-1))
        assert_near(upd.reshape(-1), O.dense_power(S, -0.5) @ G.reshape(-1))
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
        S = O.dense_orbit_average(acts, G.reshape(-1))
        assert_near(upd.reshape(-1), O.dense_power(S, -0.5) @ G.reshape(-1))


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
    expected = math.sqrt(k) * O.dense_power(Y @ Y.T, -0.5) @ Y
    assert_near(torch.cat([upd["U"], upd["V"]]), expected)
    if k <= 3:
        layout = [("U", (m, k), ["_", "k"]), ("V", (n, k), ["_", "k"])]
        acts = O.action_matrices({"k": ("orthogonal", k, None)}, layout)
        x = torch.cat([gu.reshape(-1), gv.reshape(-1)])
        S = O.dense_orbit_average(acts, x)
        assert_near(torch.cat([upd["U"].reshape(-1), upd["V"].reshape(-1)]), O.dense_power(S, -0.5) @ x)


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
    x = O.flatten(g, names)
    S = compiled.orbit_average(g).dense()
    for p in (-0.5, -1.0):
        expected = O.dense_power(S, p, damping)
        assert_near(compiled.orbit_average(g).power(p, damping).dense(), expected)
        assert_near(O.flatten(compiled.orbit_average(g).power(p, damping).matvec(g), names), expected @ x)


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


# ---------------------------------------------------------------------------------------------
# Non-finite gradients
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_gradient_names_the_parameter(bad: float) -> None:
    case = mlp_case("perm", 4)
    compiled, _ = setup(case)
    g = grads(case, 13)
    g["fc1.bias"][2] = bad
    with pytest.raises(symo.NonFiniteGradientError, match="fc1.bias"):
        compiled.orbit_average(g)


def test_large_but_finite_float64_gradient_is_accepted() -> None:
    """1e39 is finite in float64 (S ~ 1e78 is too); it must not be reported as NaN/inf."""
    case = mlp_case("signed_perm", 3)
    compiled, _ = setup(case)
    g = grads(case, 14, scale=1e39)
    S = compiled.orbit_average(g).dense()
    assert_near(S / 1e78, case_S(case, g) / 1e78)


# ---------------------------------------------------------------------------------------------
# True versus relaxed symmetries
# ---------------------------------------------------------------------------------------------


def mlp_loss(model: torch.nn.Module):
    g = gen(80)
    x = torch.randn(16, 8, dtype=D, generator=g)
    y = torch.randn(16, 4, dtype=D, generator=g)

    def loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return ((functional_call(model, params, (x,)) - y) ** 2).mean()

    return loss


@pytest.mark.parametrize("act,spec,true", [("tanh", "specs/mlp_tanh.toml", True),
                                           ("relu", "specs/mlp_tanh.toml", False),
                                           ("relu", "specs/mlp_relu.toml", True)])
def test_check_symmetry_mlp(act: str, spec: str, true: bool) -> None:
    torch.manual_seed(0)
    model = MLP(act=act).double()
    compiled = symo.compile(spec, model, disk_cache=False)
    params = {n: p.detach() for n, p in model.named_parameters()}
    report = symo.check_symmetry(mlp_loss(model), compiled, params)
    assert report.is_true_symmetry is true, report
    if not true:
        assert report.max_rel_change > 1e-6
    # the printed report carries the verdict and the numbers it rests on
    verdict = "true symmetry:" if true else "not a true symmetry (relaxed):"
    assert str(report).startswith(verdict) and f"{report.max_rel_change:.1e}" in str(report)
    assert f"over {report.trials} random group elements" in str(report)


GPT_ATTENTION_ONLY = """
[spaces]
"head{i}" = { group = "identity" }
"dqk{i}"  = { group = "orthogonal", per = "head{i}" }
"dvo{i}"  = { group = "orthogonal", per = "head{i}" }
[params]
"transformer.h.{i}.attn.c_attn.weight" = [["(head{i} dqk{i})", "(head{i} dqk{i})", "(head{i} dvo{i})"], "_"]
"transformer.h.{i}.attn.c_attn.bias"   = [["(head{i} dqk{i})", "(head{i} dqk{i})", "(head{i} dvo{i})"]]
"transformer.h.{i}.attn.c_proj.weight" = ["_", "(head{i} dvo{i})"]
"""


def gpt_setup():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=8, vocab_size=11, block_size=8)).double()
    for p in model.parameters():  # non-zero biases and LayerNorm parameters, so nothing is trivially zero
        p.data.add_(0.1 * torch.randn_like(p))
    g = gen(90)
    idx = torch.randint(0, 11, (3, 8), generator=g)
    targets = torch.randint(0, 11, (3, 8), generator=g)

    def loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return functional_call(model, params, (idx, targets))[1]

    params = {n: p.detach() for n, p in model.named_parameters()}
    return model, loss, params


def test_gpt_attention_gauges_are_a_true_symmetry() -> None:
    model, loss, params = gpt_setup()
    sizes = {"dqk{i}": 4, "dvo{i}": 4}
    compiled = compile_text(GPT_ATTENTION_ONLY, model, sizes=sizes)
    assert compiled.spaces["head0"]["size"] == 2 and compiled.spaces["dqk1"]["per"] == "head1"
    report = symo.check_symmetry(loss, compiled, params)
    assert report.is_true_symmetry, report
    # the group really moves the weights (a true symmetry that is not the identity)
    moved = compiled.act(compiled.random_element(gen(91), dtype=D), params)
    name = "transformer.h.0.attn.c_attn.weight"
    assert (moved[name] - params[name]).abs().max() > 1e-3


def test_gpt_full_spec_with_relaxed_mlp_is_not_a_true_symmetry() -> None:
    model, loss, params = gpt_setup()
    compiled = symo.compile("specs/gpt.toml", model, sizes={"dqk{i}": 4, "dvo{i}": 4}, disk_cache=False)
    assert "transformer.h.1.mlp.c_fc.weight" in compiled.param_names
    assert "transformer.wte.weight" in compiled.uncovered
    report = symo.check_symmetry(loss, compiled, params)
    assert not report.is_true_symmetry, report
