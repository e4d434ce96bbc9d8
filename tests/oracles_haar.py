"""Haar O(n) exactly, for layouts where one space occurs twice (docs/repeated_spaces.md): the degree-4 moment by
the Weingarten formula and the orbit average it gives. Independent of ``symo`` as tests/oracles.py is (float64,
small layouts only); the one oracle that the group enumeration of tests/oracles.py cannot replace, because B_n's
fourth moment differs from Haar's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from oracles import DTYPE

# --------------------------------------------------------------------------------------------
# Haar O(n) exactly, for layouts where one space occurs twice (docs/repeated_spaces.md)
# --------------------------------------------------------------------------------------------


def _matching_delta(pairs: Sequence[tuple[int, int]], n: int) -> torch.Tensor:
    """delta over 4 indices equal in pairs: 1 where x[p] == x[q] for each (p, q)."""
    eye = torch.eye(n, dtype=DTYPE)
    (a, b), (c, d) = pairs
    t = torch.einsum("ij,kl->ijkl", eye, eye)  # indices (a, b, c, d) in this order
    order = [a, b, c, d]
    return t.permute(*[order.index(k) for k in range(4)])


def haar_moment(m: int, n: int) -> torch.Tensor:
    """E[Q_{i1 a1} ... Q_{im am}] for Haar Q in O(n), as a tensor with indices (i1..im, a1..am).

    m = 0: 1; odd m: 0; m = 2: delta_{i1 i2} delta_{a1 a2} / n; m = 4: the Weingarten formula
    sum_{s, t} delta_s(i) delta_t(a) Wg(s, t) over the three perfect matchings s, t of 4 points,
    Wg(s, s) = (n + 1) / (n (n - 1) (n + 2)), Wg(s, t) = -1 / (n (n - 1) (n + 2)) for s != t
    (Collins & Sniady 2006; needs n >= 2)."""
    if m == 0:
        return torch.ones((), dtype=DTYPE)
    if m % 2:
        return torch.zeros((n,) * (2 * m), dtype=DTYPE)
    if m == 2:
        eye = torch.eye(n, dtype=DTYPE)
        return torch.einsum("ij,ab->iajb", eye, eye).permute(0, 2, 1, 3) / n  # (i1, i2, a1, a2)
    if m == 4:
        if n < 2:
            raise ValueError("the degree-4 Weingarten formula needs n >= 2")
        matchings = [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))]
        deltas = [_matching_delta(s, n) for s in matchings]
        den = n * (n - 1) * (n + 2)
        out = torch.zeros((n,) * 8, dtype=DTYPE)
        for si, ds in enumerate(deltas):
            for ti, dt in enumerate(deltas):
                wg = (n + 1) / den if si == ti else -1 / den
                out += wg * torch.einsum("abcd,efgh->abcdefgh", ds, dt)
        return out
    raise ValueError(f"moments of degree {m} are not implemented")


def _subscripts(axes, letters) -> tuple[list[str], list[str], list[str], list[str]]:
    """A parameter's einsum letters, drawn from `letters`: (the Haar moment's input and output letters of its "h"
    axes, the parameter's own subscript, the result's subscript). A free axis keeps one letter in both."""
    ins, outs, sub, res = [], [], [], []
    for axis in axes:
        if axis == "h":
            i, a = next(letters), next(letters)
            outs.append(i), ins.append(a), sub.append(a), res.append(i)
        else:
            f = next(letters)
            sub.append(f), res.append(f)
    return ins, outs, sub, res


def haar_orbit_average(n: int, params: Sequence[tuple[str, Sequence[int], Sequence[str]]],
                       v: torch.Tensor) -> torch.Tensor:
    """E_Q[A_Q v v^T A_Q^T] exactly, for Haar Q in O(n) acting on every axis named "h" (other axes
    "_" are free; at most two "h" axes per parameter). Blockwise: the (p, q) block contracts
    v_p (x) v_q with the Haar moment of degree (h axes of p) + (h axes of q)."""
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    sizes = [math.prod(s) for _, s, _ in params]
    parts = torch.split(v.to(DTYPE).reshape(-1), sizes)
    vs = [part.reshape(tuple(s)) for part, (_, s, _) in zip(parts, params)]
    rows = []
    for p, (_, _, ap) in enumerate(params):
        row = []
        for q, (_, _, aq) in enumerate(params):
            ins_p, outs_p, vp_sub, res_p = _subscripts(ap, letters)
            ins_q, outs_q, vq_sub, res_q = _subscripts(aq, letters)
            moment = haar_moment(len(outs_p) + len(outs_q), n)
            msub = "".join(outs_p + outs_q + ins_p + ins_q)
            expr = f"{msub},{''.join(vp_sub)},{''.join(vq_sub)}->{''.join(res_p + res_q)}"
            block = torch.einsum(expr, moment, vs[p], vs[q])
            row.append(block.reshape(sizes[p], sizes[q]))
            letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
        rows.append(torch.cat(row, dim=1))
    return torch.cat(rows, dim=0)
