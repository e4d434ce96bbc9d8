"""Diagram bases (repeated spaces, docs/repeated_spaces.md) against explicit tensors and exhaustive group averages."""

import itertools

import oracles as O
import pytest
import sympy
import torch
from symo.compiler.diagrams import N, commutant_dimension, diagrams, gram_matrix, set_partitions


def delta(partition, n):
    """The diagram tensor: 1 where indices inside each block agree."""
    k = sum(len(b) for b in partition)
    t = torch.zeros((n,) * k, dtype=torch.float64)
    for idx in itertools.product(range(n), repeat=k):
        if all(len({idx[i] for i in b}) == 1 for b in partition):
            t[idx] = 1.0
    return t


def test_bell_numbers():
    assert [len(set_partitions(k)) for k in range(1, 6)] == [1, 2, 5, 15, 52]


@pytest.mark.parametrize("group,expected", [("perm", 15), ("signed_perm", 4), ("orthogonal", 3)])
def test_commutant_dimensions_of_rn_tensor_rn(group, expected):
    # R^n (x) R^n as an operator space has four indices: 15, 4 and 3 basis diagrams
    assert commutant_dimension(group, 4) == expected


@pytest.mark.parametrize("group", ["perm", "signed_perm", "orthogonal"])
def test_gram_matrix_matches_explicit_tensors(group):
    n = 3
    basis = diagrams(group, 4)
    tensors = [delta(p, n).reshape(-1) for p in basis]
    explicit = torch.stack([torch.stack([a @ b for b in tensors]) for a in tensors])
    symbolic = gram_matrix(group, 4).subs(N, n)
    assert torch.equal(explicit, torch.tensor(sympy.matrix2numpy(symbolic, dtype=float)))


@pytest.mark.parametrize("group,kind,n", [("perm", "perm", 4), ("signed_perm", "signed_perm", 3)])
def test_diagram_span_is_the_commutant(group, kind, n):
    """Average of a random operator on R^n (x) R^n over the group lies in the span of the diagrams,
    and the span's dimension equals the rank of the averaging map (exhaustive enumeration; perm needs
    n >= 4 for the 15 diagrams to be independent)."""
    elements = O.group_elements(kind, n)
    mats = [torch.kron(q, q) for q in elements]
    basis = torch.stack([delta(p, n).reshape(n * n, n * n).reshape(-1) for p in diagrams(group, 4)])
    torch.manual_seed(0)
    x = torch.randn(n * n, n * n, dtype=torch.float64)
    avg = sum(m @ x @ m.T for m in mats) / len(mats)
    coef = torch.linalg.lstsq(basis.T, avg.reshape(-1, 1)).solution
    assert torch.allclose(basis.T @ coef, avg.reshape(-1, 1), atol=1e-10)
    # rank of the averaging superoperator = commutant dimension
    sup = sum(torch.kron(m, m) for m in mats) / len(mats)
    assert torch.linalg.matrix_rank(sup).item() == len(diagrams(group, 4))


def test_gram_is_invertible_for_large_n():
    assert sympy.simplify(gram_matrix("orthogonal", 4).det()) != 0
