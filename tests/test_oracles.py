"""Tests of the dense oracles themselves, against closed forms derived by hand."""

from __future__ import annotations

import math

import oracles as O
import pytest
import torch

D = torch.float64


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=D, generator=gen(seed))


# ---------------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,n,order",
    [
        ("identity", 3, 1),
        ("perm", 3, 6),
        ("perm", 4, 24),
        ("signed_perm", 3, 48),
        ("signed_perm", 4, 384),
        ("orthogonal", 3, 48),
    ],
)
def test_group_sizes_distinct_orthogonal(kind: str, n: int, order: int) -> None:
    els = O.group_elements(kind, n)
    assert len(els) == order
    assert len({tuple(e.flatten().tolist()) for e in els}) == order
    eye = torch.eye(n, dtype=D)
    for e in els:
        assert e.dtype == D and e.shape == (n, n)
        torch.testing.assert_close(e @ e.T, eye, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["perm", "signed_perm"])
def test_group_closed_under_product(kind: str) -> None:
    els = O.group_elements(kind, 3)
    keys = {tuple(e.flatten().tolist()) for e in els}
    for a in els:
        for b in els:
            assert tuple((a @ b).flatten().tolist()) in keys


def test_perm_entries_are_zero_one_with_unit_rows() -> None:
    for e in O.group_elements("perm", 4):
        assert set(e.unique().tolist()) == {0.0, 1.0}
        torch.testing.assert_close(e.sum(0), torch.ones(4, dtype=D))
        torch.testing.assert_close(e.sum(1), torch.ones(4, dtype=D))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_signed_perm_second_moment_is_exactly_haar(n: int) -> None:
    """E[Q_ia Q_jb] over B_n equals delta_ij delta_ab / n exactly; E[Q] = 0."""
    qs = torch.stack(O.group_elements("signed_perm", n))
    m2 = torch.einsum("kia,kjb->iajb", qs, qs) / len(qs)
    eye = torch.eye(n, dtype=D)
    expected = torch.einsum("ij,ab->iajb", eye, eye) / n
    torch.testing.assert_close(m2, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(qs.mean(0), torch.zeros(n, n, dtype=D), rtol=0, atol=1e-15)


def test_perm_second_moment_is_not_haar() -> None:
    """Sanity: S_n is not a second-moment design (its averages keep the mean direction)."""
    qs = torch.stack(O.group_elements("perm", 3))
    m2 = torch.einsum("kia,kjb->iajb", qs, qs) / len(qs)
    eye = torch.eye(3, dtype=D)
    assert not torch.allclose(m2, torch.einsum("ij,ab->iajb", eye, eye) / 3)


def test_haar_orthogonal_is_orthogonal_and_deterministic() -> None:
    q = O.haar_orthogonal(5, gen(1))
    torch.testing.assert_close(q @ q.T, torch.eye(5, dtype=D))
    torch.testing.assert_close(q, O.haar_orthogonal(5, gen(1)), rtol=0, atol=0)


def test_haar_empirical_moments() -> None:
    n, k = 3, 20000
    g = gen(2)
    qs = torch.stack([O.haar_orthogonal(n, g) for _ in range(k)])
    eye = torch.eye(n, dtype=D)
    m2 = torch.einsum("kia,kjb->iajb", qs, qs) / k
    expected = torch.einsum("ij,ab->iajb", eye, eye) / n
    # Each entry is a mean of bounded terms with variance <= 1: standard error <= 1/sqrt(k).
    assert (m2 - expected).abs().max() < 6 / math.sqrt(k)
    assert qs.mean(0).abs().max() < 6 / math.sqrt(k)
    # Haar is also invariant under left multiplication: the diagonal is not biased in sign.
    assert torch.diagonal(qs, dim1=1, dim2=2).mean().abs() < 6 / math.sqrt(k)


# ---------------------------------------------------------------------------------------------
# Layouts and action matrices
# ---------------------------------------------------------------------------------------------

MIXED_SPACES = {
    "h": ("perm", 3, None),
    "s": ("signed_perm", 2, None),
    "head": ("identity", 2, None),
    "dqk": ("orthogonal", 2, "head"),
}
MIXED_PARAMS = [
    ("W1", (3, 2), ["h", "_"]),
    ("b1", (3,), ["h"]),
    ("W2", (2, 3), ["s", "h"]),
    ("Wq", (4, 2), [("head", "dqk"), "_"]),
    ("fused", (8,), [[("_", 1), "h", ("head", "dqk")]]),
]


def test_mixed_layout_order_and_orthogonality() -> None:
    acts = O.action_matrices(MIXED_SPACES, MIXED_PARAMS)
    assert len(acts) == 6 * 8 * 1 * 8**2 == O.group_order(MIXED_SPACES)
    p = O.param_size(MIXED_PARAMS)
    assert p == 6 + 3 + 6 + 8 + 8
    eye = torch.eye(p, dtype=D)
    for a in acts[::7]:
        torch.testing.assert_close(a @ a.T, eye, rtol=0, atol=1e-14)


def test_action_shares_one_element_across_parameters() -> None:
    """W1 rows, b1 and W2 columns move with the same permutation; a fused axis acts by segment."""
    g = O.random_element(MIXED_SPACES, gen(3))
    h, s, q = g["h"], g["s"], g["dqk"]
    w = {n: randn(*shape, seed=i) for i, (n, shape, _) in enumerate(MIXED_PARAMS)}
    names = [n for n, _, _ in MIXED_PARAMS]
    shapes = [shape for _, shape, _ in MIXED_PARAMS]
    a = O.action_matrix(MIXED_SPACES, MIXED_PARAMS, g)
    out = O.unflatten(a @ O.flatten(w, names), names, shapes)
    blockq = torch.block_diag(*q)  # head-major (head dqk)
    torch.testing.assert_close(out["W1"], h @ w["W1"])
    torch.testing.assert_close(out["b1"], h @ w["b1"])
    torch.testing.assert_close(out["W2"], s @ w["W2"] @ h.T)
    torch.testing.assert_close(out["Wq"], blockq @ w["Wq"])
    f = w["fused"]
    torch.testing.assert_close(out["fused"], torch.cat([f[:1], h @ f[1:4], blockq @ f[4:]]))


def test_product_axis_is_row_major() -> None:
    spaces = {"a": ("perm", 2, None), "b": ("signed_perm", 3, None)}
    params = [("x", (6,), [("a", "b")])]
    g = O.random_element(spaces, gen(4))
    a = O.action_matrix(spaces, params, g)
    x = randn(2, 3, seed=5)  # x[i_a, i_b] at flat index i_a * 3 + i_b
    torch.testing.assert_close(a @ x.reshape(-1), (g["a"] @ x @ g["b"].T).reshape(-1))


def test_repeated_space_acts_on_both_axes() -> None:
    spaces = {"h": ("signed_perm", 3, None)}
    params = [("Whh", (3, 3), ["h", "h"])]
    g = O.random_element(spaces, gen(6))
    w = randn(3, 3, seed=7)
    a = O.action_matrix(spaces, params, g)
    torch.testing.assert_close(a @ w.reshape(-1), (g["h"] @ w @ g["h"].T).reshape(-1))


def test_per_space_with_owner_on_another_axis() -> None:
    """Owner and per-space on different axes, also inside a fused axis: block-diagonal by head."""
    spaces = {"head": ("identity", 2, None), "d": ("orthogonal", 2, "head")}
    params = [("T", (2, 2, 3), ["head", "d", "_"]), ("F", (2, 3), ["head", [("_", 1), "d"]])]
    g = O.random_element(spaces, gen(27))
    t, f = randn(2, 2, 3, seed=28), randn(2, 3, seed=29)
    a = O.action_matrix(spaces, params, g)
    out = O.unflatten(a @ torch.cat([t.reshape(-1), f.reshape(-1)]), ["T", "F"], [(2, 2, 3), (2, 3)])
    q = g["d"]
    torch.testing.assert_close(out["T"], torch.stack([q[h] @ t[h] for h in range(2)]))
    expected_f = torch.stack([torch.cat([f[h, :1], q[h] @ f[h, 1:]]) for h in range(2)])
    torch.testing.assert_close(out["F"], expected_f)


@pytest.mark.parametrize(
    "params",
    [
        [("W", (3, 2), ["h"])],  # wrong number of axes
        [("W", (4, 2), ["h", "_"])],  # wrong size
        [("W", (2, 2), ["dqk", "_"])],  # per-space without owner
        [("W", (5,), [["h", "_"]])],  # bare "_" inside a fused axis
    ],
)
def test_bad_layouts_raise(params: list) -> None:
    with pytest.raises(ValueError):
        O.action_matrices(MIXED_SPACES, params)


def test_sample_action_orthogonal() -> None:
    a = O.sample_action(MIXED_SPACES, MIXED_PARAMS, gen(8))
    torch.testing.assert_close(a @ a.T, torch.eye(a.shape[0], dtype=D))


# ---------------------------------------------------------------------------------------------
# Orbit averages against closed forms
# ---------------------------------------------------------------------------------------------


def test_average_is_invariant_and_R1_is_invariant() -> None:
    acts = O.action_matrices(MIXED_SPACES, MIXED_PARAMS)
    v = randn(O.param_size(MIXED_PARAMS), seed=9)
    s = O.dense_orbit_average(acts, v)
    r1 = O.dense_R1(acts, v)
    torch.testing.assert_close(s, s.T, rtol=0, atol=1e-12)
    for a in acts[::5]:
        torch.testing.assert_close(a @ s @ a.T, s, rtol=0, atol=1e-12)
        torch.testing.assert_close(a @ r1, r1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["signed_perm", "orthogonal"])
def test_case1_muon_rows_signed(kind: str) -> None:
    """The Muon case: S_g = I_m (x) G^T G / m."""
    m, n = 3, 4
    spaces = {"r": (kind, m, None)}
    params = [("W", (m, n), ["r", "_"])]
    G = randn(m, n, seed=10)
    s = O.dense_orbit_average(O.action_matrices(spaces, params), G.reshape(-1))
    expected = torch.kron(torch.eye(m, dtype=D), G.T @ G / m)
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        O.dense_R1(O.action_matrices(spaces, params), G.reshape(-1)),
        torch.zeros(m * n, dtype=D),
        rtol=0,
        atol=1e-14,
    )


def test_case1_haar_monte_carlo() -> None:
    """Haar samples reproduce the same closed form up to Monte Carlo error."""
    m, n, k = 3, 2, 4000
    spaces = {"r": ("orthogonal", m, None)}
    params = [("W", (m, n), ["r", "_"])]
    G = randn(m, n, seed=11)
    g = gen(12)
    s = O.dense_orbit_average([O.sample_action(spaces, params, g) for _ in range(k)], G.reshape(-1))
    expected = torch.kron(torch.eye(m, dtype=D), G.T @ G / m)
    assert torch.linalg.norm(s - expected) / torch.linalg.norm(expected) < 0.1


def test_case1_perm_rows_mean_row_separates() -> None:
    """Rows `perm`: S = J/m (x) G^T J G / m  +  (I - J/m) (x) G^T (I - J/m) G / (m - 1)."""
    m, n = 4, 3
    spaces = {"r": ("perm", m, None)}
    params = [("W", (m, n), ["r", "_"])]
    G = randn(m, n, seed=13)
    acts = O.action_matrices(spaces, params)
    s = O.dense_orbit_average(acts, G.reshape(-1))
    J = torch.ones(m, m, dtype=D)
    P = torch.eye(m, dtype=D) - J / m
    expected = torch.kron(J / m, G.T @ J @ G / m) + torch.kron(P, G.T @ P @ G / (m - 1))
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-12)
    # R1 keeps exactly the mean row.
    torch.testing.assert_close(O.dense_R1(acts, G.reshape(-1)), (J / m @ G).reshape(-1))


def test_case3_hidden_to_hidden_is_scalar() -> None:
    """Both spaces signed: S_g = ||G||^2 / (h1 h2) I."""
    h2, h1 = 2, 3
    spaces = {"a": ("signed_perm", h1, None), "b": ("signed_perm", h2, None)}
    params = [("W", (h2, h1), ["b", "a"])]
    G = randn(h2, h1, seed=14)
    s = O.dense_orbit_average(O.action_matrices(spaces, params), G.reshape(-1))
    expected = (G**2).sum() / (h1 * h2) * torch.eye(h1 * h2, dtype=D)
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-12)


def test_case6_per_head_gauge() -> None:
    """Attention heads, Y_h = [G_Q,h^T ; G_K,h^T], heads never couple:

    S[(X,h,c,i),(Y,h',c',i')] = d_hh' d_cc' sum_r G_X[h,r,i] G_Y[h,r,i'] / d_head, with X, Y in
    {Q, K}, rows split as (head, d_head), c and r over d_head, i over d_model.
    """
    nh, dh, dm = 2, 2, 3
    spaces = {"head": ("identity", nh, None), "dqk": ("orthogonal", dh, "head")}
    params = [
        ("Wq", (nh * dh, dm), [("head", "dqk"), "_"]),
        ("Wk", (nh * dh, dm), [("head", "dqk"), "_"]),
    ]
    gq, gk = randn(nh, dh, dm, seed=15), randn(nh, dh, dm, seed=16)
    v = torch.cat([gq.reshape(-1), gk.reshape(-1)])
    s = O.dense_orbit_average(O.action_matrices(spaces, params), v)
    g = torch.stack([gq, gk])  # (X, head, d_head, d_model)
    gram = torch.einsum("xhcr,yhcs->xhrys", g, g) / dh  # per head: Y_h Y_h^T / dh, Y_h rows (X, r)
    eye_h, eye_c = torch.eye(nh, dtype=D), torch.eye(dh, dtype=D)
    expected = torch.einsum("xhrys,hk,cd->xhcrykds", gram, eye_h, eye_c)
    torch.testing.assert_close(s, expected.reshape(v.numel(), v.numel()), rtol=0, atol=1e-12)


# Two S_3 spaces: W1 (3 x 2, rows a), W2 (3 x 3, rows b, cols a), b2 (3, b), W3 (2 x 3, cols b).
TWO_SPACES = {"a": ("perm", 3, None), "b": ("perm", 3, None)}
TWO_PARAMS = [
    ("W1", (3, 2), ["a", "_"]),
    ("W2", (3, 3), ["b", "a"]),
    ("b2", (3,), ["b"]),
    ("W3", (2, 3), ["_", "b"]),
]
# Labels (piece of a, piece of b) with (multiplicity, irrep dimension), counted by hand:
# (t,t): W1 2 cols + W2 1 + b2 1 + W3 2 rows = 6, dim 1
# (s,t): W1 2 cols + W2 column means 1    = 3, dim 2
# (t,s): W2 row means 1 + b2 1 + W3 2 rows = 4, dim 2
# (s,s): W2 1                               = 1, dim 4
LABELS = {"tt": (6, 1), "st": (3, 2), "ts": (4, 2), "ss": (1, 4)}


def _two_space_components() -> dict[str, list[torch.Tensor]]:
    """For each label, the P x N coordinate maps K_c of its components.

    Trivial piece: u = 1/sqrt(3); standard piece: projector columns Pi = I - J/3, n coordinates.
    """
    n = 3
    u = torch.full((n,), 1 / math.sqrt(n), dtype=D)
    pi = torch.eye(n, dtype=D) - 1.0 / n
    e2 = torch.eye(2, dtype=D)
    offsets, off = {}, 0
    for name, shape, _ in TWO_PARAMS:
        offsets[name] = (off, shape)
        off += math.prod(shape)
    p = off

    def embed(name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
        k = torch.zeros(p, len(tensors), dtype=D)
        start, shape = offsets[name]
        for j, t in enumerate(tensors):
            k[start : start + math.prod(shape), j] = t.reshape(-1)
        return k

    out: dict[str, list[torch.Tensor]] = {key: [] for key in LABELS}
    for j in range(2):
        out["tt"].append(embed("W1", [torch.outer(u, e2[j])]))
        out["st"].append(embed("W1", [torch.outer(pi[:, k], e2[j]) for k in range(n)]))
        out["tt"].append(embed("W3", [torch.outer(e2[j], u)]))
        out["ts"].append(embed("W3", [torch.outer(e2[j], pi[:, k]) for k in range(n)]))
    out["tt"].append(embed("W2", [torch.outer(u, u)]))
    out["st"].append(embed("W2", [torch.outer(u, pi[:, k]) for k in range(n)]))
    out["ts"].append(embed("W2", [torch.outer(pi[:, k], u) for k in range(n)]))
    out["ss"].append(embed("W2", [torch.outer(pi[:, kb], pi[:, ka]) for ka in range(n) for kb in range(n)]))
    out["tt"].append(embed("b2", [u]))
    out["ts"].append(embed("b2", [pi[:, k] for k in range(n)]))
    return out


def test_two_space_labels_closed_form() -> None:
    """S_g = sum_lambda sum_{c,c'} (Y Y^T)_{cc'} / d_lambda K_c K_c'^T, labels never couple."""
    comps = _two_space_components()
    for key, (mult, _) in LABELS.items():
        assert len(comps[key]) == mult
    v = randn(O.param_size(TWO_PARAMS), seed=17)
    expected = torch.zeros(v.numel(), v.numel(), dtype=D)
    for key, ks in comps.items():
        d = LABELS[key][1]
        y = torch.stack([k.T @ v for k in ks])  # (multiplicity, N)
        yy = y @ y.T / d
        for c, kc in enumerate(ks):
            for c2, kc2 in enumerate(ks):
                expected += yy[c, c2] * kc @ kc2.T
    s = O.dense_orbit_average(O.action_matrices(TWO_SPACES, TWO_PARAMS), v)
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-12)
    # The (s,t) label couples W1 with the column means of W2: a non-zero cross block.
    assert s[0:6, 6:15].abs().max() > 1e-3
    # Rank: each label contributes min(multiplicity, d) * d.
    rank = sum(min(m, d) * d for m, d in LABELS.values())
    assert rank == 13
    assert torch.linalg.matrix_rank(s, hermitian=True) == rank


def test_two_space_commutant_dimension() -> None:
    """The averaging map S -> E[A S A^T] is a projection of rank sum_lambda m_lambda^2."""
    acts = O.action_matrices(TWO_SPACES, TWO_PARAMS)
    p = acts[0].shape[0]
    assert sum(m * d for m, d in LABELS.values()) == p
    avg = sum(torch.kron(a, a) for a in acts) / len(acts)  # acts on row-major vec(S)
    torch.testing.assert_close(avg @ avg, avg, rtol=0, atol=1e-12)
    expected = sum(m * m for m, _ in LABELS.values())
    assert expected == 62
    assert round(float(torch.trace(avg))) == expected
    assert torch.linalg.matrix_rank(avg) == expected
    # Symmetric part: sum m (m + 1) / 2, by averaging a basis of symmetric matrices.
    basis = []
    for i in range(p):
        for j in range(i, p):
            e = torch.zeros(p, p, dtype=D)
            e[i, j] = e[j, i] = 1.0
            basis.append(avg @ e.reshape(-1))
    sym_rank = torch.linalg.matrix_rank(torch.stack(basis))
    assert sym_rank == sum(m * (m + 1) // 2 for m, _ in LABELS.values()) == 38


@pytest.mark.parametrize("kind,n,dim", [("perm", 4, 15), ("signed_perm", 3, 4), ("signed_perm", 4, 4)])
def test_repeated_space_commutant_dimension(kind: str, n: int, dim: int) -> None:
    """R^n (x) R^n (W_hh, one space on both axes): Bell(4) = 15 for S_n, 4 for B_n.

    The commutant dimension is E_g[tr(A_g)^2] (character inner product).
    """
    spaces = {"h": (kind, n, None)}
    acts = O.action_matrices(spaces, [("W", (n, n), ["h", "h"])])
    assert round(float(sum(torch.trace(a) ** 2 for a in acts) / len(acts))) == dim


def test_orthogonal_stand_in_is_not_exact_for_repeated_spaces() -> None:
    """Documented limitation: B_n gives 4 here, Haar O(n) gives 3 (Brauer diagrams)."""
    spaces = {"h": ("orthogonal", 3, None)}
    acts = O.action_matrices(spaces, [("W", (3, 3), ["h", "h"])])
    assert round(float(sum(torch.trace(a) ** 2 for a in acts) / len(acts))) == 4
    g = gen(18)
    qs = [O.haar_orthogonal(3, g) for _ in range(4000)]
    haar = float(sum(torch.trace(q) ** 4 for q in qs) / len(qs))  # tr(Q (x) Q)^2 = tr(Q)^4
    assert abs(haar - 3) < 0.3


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def test_flatten_unflatten_roundtrip_row_major() -> None:
    w = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([7.0, 8.0])}
    v = O.flatten(w, ["b", "a"])
    assert v.dtype == D
    torch.testing.assert_close(v, torch.tensor([7.0, 8.0, 0, 1, 2, 3, 4, 5], dtype=D))
    back = O.unflatten(v, ["b", "a"], [(2,), (2, 3)])
    torch.testing.assert_close(back["a"], w["a"].to(D))
    with pytest.raises(ValueError):
        O.unflatten(v, ["a"], [(2, 3)])


def test_dense_power_closed_forms() -> None:
    q = O.haar_orthogonal(4, gen(19))
    evals = torch.tensor([4.0, 1.0, 0.0, 0.25], dtype=D)
    s = q @ torch.diag(evals) @ q.T
    torch.testing.assert_close(O.dense_power(s, 0.5), q @ torch.diag(evals.sqrt()) @ q.T)
    inv_sqrt = torch.tensor([0.5, 1.0, 0.0, 2.0], dtype=D)  # zero stays zero
    torch.testing.assert_close(O.dense_power(s, -0.5), q @ torch.diag(inv_sqrt) @ q.T)
    damped = torch.tensor([(4 + 0.4) ** -1, (1 + 0.4) ** -1, 0.0, (0.25 + 0.4) ** -1], dtype=D)
    torch.testing.assert_close(O.dense_power(s, -1.0, damping=0.1), q @ torch.diag(damped) @ q.T)
    # Algebra: S^{-1/2} S^{-1/2} S is the projector onto the support.
    proj = q @ torch.diag(torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=D)) @ q.T
    torch.testing.assert_close(O.dense_power(s, -0.5) @ O.dense_power(s, -0.5) @ s, proj)


def test_dense_power_roundoff_zero_is_zero() -> None:
    g = randn(5, 2, seed=20)
    s = g @ g.T  # rank 2; the other eigenvalues are roundoff
    r = O.dense_power(s, -0.5)
    assert torch.isfinite(r).all()
    assert torch.linalg.matrix_rank(r, hermitian=True) == 2


def test_dense_hessian_and_gradient_quadratic() -> None:
    """L = 1/2 x^T M x + c^T x over two named tensors: Hessian M, gradient M x + c."""
    m0 = randn(5, 5, seed=21)
    m = m0 @ m0.T
    c = randn(5, seed=22)
    w = {"A": randn(2, 2, seed=23), "b": randn(1, seed=24)}

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.cat([p["A"].reshape(-1), p["b"]])
        return 0.5 * x @ m @ x + c @ x

    torch.testing.assert_close(O.dense_hessian(loss, w, ["A", "b"]), m)
    x = O.flatten(w, ["A", "b"])
    torch.testing.assert_close(O.dense_gradient(loss, w, ["A", "b"]), m @ x + c)


def test_invariant_loss_hessian_equivariance() -> None:
    """Orbit equivariance: for an S_3-invariant MLP loss, Hess L(A w) = A Hess L(w) A^T."""
    spaces = {"h": ("perm", 3, None)}
    params = [("W1", (3, 2), ["h", "_"]), ("b1", (3,), ["h"]), ("W2", (1, 3), ["_", "h"])]
    names = [n for n, _, _ in params]
    shapes = [s for _, s, _ in params]
    x = randn(4, 2, seed=25)

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return (torch.tanh(x @ p["W1"].T + p["b1"]) @ p["W2"].T).pow(2).mean()

    w = {n: randn(*s, seed=30 + i) for i, (n, s) in enumerate(zip(names, shapes))}
    a = O.sample_action(spaces, params, gen(26))
    wa = O.unflatten(a @ O.flatten(w, names), names, shapes)
    torch.testing.assert_close(loss(wa), loss({k: t.to(D) for k, t in w.items()}))
    h, ha = O.dense_hessian(loss, w, names), O.dense_hessian(loss, wa, names)
    torch.testing.assert_close(ha, a @ h @ a.T)
