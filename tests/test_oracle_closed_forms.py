"""Tests of the dense orbit averages against closed forms derived by hand: Muon's rows (case 1), a hidden-to-hidden
matrix (case 3), a per-head gauge (case 6), two permuted spaces' isotypic labels and the commutant dimensions of
repeated spaces. The groups, layouts and dense tools the oracles are built from are tested in test_oracles.py."""

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


@pytest.mark.parametrize("kind", ["signed_perm", "orthogonal"])
def test_case1_muon_rows_signed(kind: str) -> None:
    """The Muon case: S_g = I_m (x) G^T G / m."""
    m, n = 3, 4
    spaces = {"r": (kind, m, None)}
    params = [("W", (m, n), ["r", "_"])]
    G = randn(m, n, seed=10)
    s = OD.dense_orbit_average(O.action_matrices(spaces, params), G.reshape(-1))
    expected = torch.kron(torch.eye(m, dtype=D), G.T @ G / m)
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        OD.dense_R1(O.action_matrices(spaces, params), G.reshape(-1)),
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
    s = OD.dense_orbit_average([O.sample_action(spaces, params, g) for _ in range(k)], G.reshape(-1))
    expected = torch.kron(torch.eye(m, dtype=D), G.T @ G / m)
    assert torch.linalg.norm(s - expected) / torch.linalg.norm(expected) < 0.1


def test_case1_perm_rows_mean_row_separates() -> None:
    """Rows `perm`: S = J/m (x) G^T J G / m  +  (I - J/m) (x) G^T (I - J/m) G / (m - 1)."""
    m, n = 4, 3
    spaces = {"r": ("perm", m, None)}
    params = [("W", (m, n), ["r", "_"])]
    G = randn(m, n, seed=13)
    acts = O.action_matrices(spaces, params)
    s = OD.dense_orbit_average(acts, G.reshape(-1))
    J = torch.ones(m, m, dtype=D)
    P = torch.eye(m, dtype=D) - J / m
    expected = torch.kron(J / m, G.T @ J @ G / m) + torch.kron(P, G.T @ P @ G / (m - 1))
    torch.testing.assert_close(s, expected, rtol=0, atol=1e-12)
    # R1 keeps exactly the mean row.
    torch.testing.assert_close(OD.dense_R1(acts, G.reshape(-1)), (J / m @ G).reshape(-1))


def test_case3_hidden_to_hidden_is_scalar() -> None:
    """Both spaces signed: S_g = ||G||^2 / (h1 h2) I."""
    h2, h1 = 2, 3
    spaces = {"a": ("signed_perm", h1, None), "b": ("signed_perm", h2, None)}
    params = [("W", (h2, h1), ["b", "a"])]
    G = randn(h2, h1, seed=14)
    s = OD.dense_orbit_average(O.action_matrices(spaces, params), G.reshape(-1))
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
    s = OD.dense_orbit_average(O.action_matrices(spaces, params), v)
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
    s = OD.dense_orbit_average(O.action_matrices(TWO_SPACES, TWO_PARAMS), v)
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
