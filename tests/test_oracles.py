"""Tests of the dense oracles themselves, against closed forms derived by hand: the groups, the layouts and action
matrices, the orbit average's invariance and the dense tools (the orbit averages' closed forms by case are in
test_oracle_closed_forms.py)."""

from __future__ import annotations

import math

import oracles as O
import oracles_dense as OD
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
    out = OD.unflatten(a @ OD.flatten(w, names), names, shapes)
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
    out = OD.unflatten(a @ torch.cat([t.reshape(-1), f.reshape(-1)]), ["T", "F"], [(2, 2, 3), (2, 3)])
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
    s = OD.dense_orbit_average(acts, v)
    r1 = OD.dense_R1(acts, v)
    torch.testing.assert_close(s, s.T, rtol=0, atol=1e-12)
    for a in acts[::5]:
        torch.testing.assert_close(a @ s @ a.T, s, rtol=0, atol=1e-12)
        torch.testing.assert_close(a @ r1, r1, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def test_flatten_unflatten_roundtrip_row_major() -> None:
    w = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([7.0, 8.0])}
    v = OD.flatten(w, ["b", "a"])
    assert v.dtype == D
    torch.testing.assert_close(v, torch.tensor([7.0, 8.0, 0, 1, 2, 3, 4, 5], dtype=D))
    back = OD.unflatten(v, ["b", "a"], [(2,), (2, 3)])
    torch.testing.assert_close(back["a"], w["a"].to(D))
    with pytest.raises(ValueError):
        OD.unflatten(v, ["a"], [(2, 3)])


def test_dense_power_closed_forms() -> None:
    q = O.haar_orthogonal(4, gen(19))
    evals = torch.tensor([4.0, 1.0, 0.0, 0.25], dtype=D)
    s = q @ torch.diag(evals) @ q.T
    torch.testing.assert_close(OD.dense_power(s, 0.5), q @ torch.diag(evals.sqrt()) @ q.T)
    inv_sqrt = torch.tensor([0.5, 1.0, 0.0, 2.0], dtype=D)  # zero stays zero
    torch.testing.assert_close(OD.dense_power(s, -0.5), q @ torch.diag(inv_sqrt) @ q.T)
    damped = torch.tensor([(4 + 0.4) ** -1, (1 + 0.4) ** -1, 0.0, (0.25 + 0.4) ** -1], dtype=D)
    torch.testing.assert_close(OD.dense_power(s, -1.0, damping=0.1), q @ torch.diag(damped) @ q.T)
    # Algebra: S^{-1/2} S^{-1/2} S is the projector onto the support.
    proj = q @ torch.diag(torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=D)) @ q.T
    torch.testing.assert_close(OD.dense_power(s, -0.5) @ OD.dense_power(s, -0.5) @ s, proj)


def test_dense_power_roundoff_zero_is_zero() -> None:
    g = randn(5, 2, seed=20)
    s = g @ g.T  # rank 2; the other eigenvalues are roundoff
    r = OD.dense_power(s, -0.5)
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

    torch.testing.assert_close(OD.dense_hessian(loss, w, ["A", "b"]), m)
    x = OD.flatten(w, ["A", "b"])
    torch.testing.assert_close(OD.dense_gradient(loss, w, ["A", "b"]), m @ x + c)


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
    wa = OD.unflatten(a @ OD.flatten(w, names), names, shapes)
    torch.testing.assert_close(loss(wa), loss({k: t.to(D) for k, t in w.items()}))
    h, ha = OD.dense_hessian(loss, w, names), OD.dense_hessian(loss, wa, names)
    torch.testing.assert_close(ha, a @ h @ a.T)
