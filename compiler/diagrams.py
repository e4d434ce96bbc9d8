"""Diagram bases of commutants for repeated spaces (docs/theory.md), symbolic in the size n.

When a space occurs k times in the operator's indices (e.g. the (row, col, row', col') indices of
S for an RNN's W_hh, k = 4), the commutant of its group is spanned by diagram tensors delta_pi:
    perm (S_n)         all set partitions of the k points           (Bell(k) when n >= k)
    signed_perm (B_n)  set partitions whose blocks all have even size
    orthogonal (O(n))  perfect matchings (Brauer diagrams)
with Gram matrix <delta_pi, delta_sigma> = n^(blocks of the join of pi and sigma). The Gram matrix is
rational in n, so projection coefficients onto the commutant are exact sympy expressions. This module
is the symbolic groundwork of compiler.repeated (spaces that repeat within one tensor); the compiler also
uses it to say what a repeated space would cost.
"""

from __future__ import annotations

from functools import cache

import networkx as nx
import sympy

Partition = tuple[tuple[int, ...], ...]

N = sympy.Symbol("n", positive=True, integer=True)


def set_partitions(k: int) -> list[Partition]:
    """All set partitions of {0..k-1}, each block sorted, blocks ordered by their first element."""
    if k == 0:
        return [()]
    out = []
    for smaller in set_partitions(k - 1):
        out.append((*smaller, (k - 1,)))
        for i in range(len(smaller)):
            out.append(tuple(b + (k - 1,) if j == i else b for j, b in enumerate(smaller)))
    return sorted(tuple(sorted(p)) for p in out)


@cache
def diagrams(group: str, k: int) -> tuple[Partition, ...]:
    """The diagram basis of the commutant of `group` acting on (R^n)^{(x) k}, for n >= k."""
    parts = set_partitions(k)
    if group == "perm":
        return tuple(parts)
    if group == "signed_perm":
        return tuple(p for p in parts if all(len(b) % 2 == 0 for b in p))
    if group == "orthogonal":
        return tuple(p for p in parts if all(len(b) == 2 for b in p))
    raise ValueError(f"no diagram basis for group {group!r}")


def join_blocks(a: Partition, b: Partition, k: int) -> int:
    """Number of blocks of the join (finest common coarsening) of two partitions of k points."""
    graph = nx.Graph()
    graph.add_nodes_from(range(k))
    for block in (*a, *b):
        graph.add_edges_from(zip(block, block[1:]))
    return nx.number_connected_components(graph)


@cache
def gram_matrix(group: str, k: int) -> sympy.Matrix:
    """<delta_pi, delta_sigma> = n^(blocks of pi v sigma), as a sympy matrix in the symbol n."""
    basis = diagrams(group, k)
    return sympy.Matrix(len(basis), len(basis), lambda i, j: N ** join_blocks(basis[i], basis[j], k))


def commutant_dimension(group: str, k: int) -> int:
    return len(diagrams(group, k))
