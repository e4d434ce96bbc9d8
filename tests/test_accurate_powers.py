"""Undamped float32 powers: accurate on full-rank matrices, bounded on rank-deficient ones.

The oracle is the float64 polar factor U V^T from an SVD (for a rank-r matrix: U_r V_r^T), since
(G G^T)^{-1/2} G is the polar factor on the range of G. The "direct formula" G (G^T G)^{-1/2} in
float32 (eigh of the float32 Gram, eigenvalues clamped at 1e-30) is the baseline the issue names.
"""

from __future__ import annotations

import pytest
import torch
from helpers import polar, rel

import symo
from symo.runtime.linalg import gram_power_apply, root_power

MUON = '[spaces]\nr = { group = "signed_perm" }\n[params]\n"w" = ["r", "_"]\n'


def test_square_gaussian_within_twice_the_direct_formula() -> None:
    n = 192
    g = torch.randn(n, n, generator=torch.Generator().manual_seed(0))  # float32, cond ~ 1e3
    target = polar(g)
    evals, evecs = torch.linalg.eigh(g.T @ g)
    direct = g @ ((evecs * evals.clamp_min(1e-30).rsqrt()) @ evecs.T)
    compiled = symo.compile(symo.parse_spec(MUON), {"w": (n, n)}, disk_cache=False)
    ours = compiled.orbit_average({"w": g}).power(-0.5).matvec({"w": g})["w"] / n ** 0.5
    assert ours.dtype == torch.float32
    err_direct, err_ours = rel(direct, target), rel(ours, target)
    assert err_ours <= 2 * err_direct, (err_ours, err_direct)
    assert err_ours < 1e-4  # float32 output of a float64 computation: a few eps32 times cond
    # the optimizer's primitive, wide and tall: (Y Y^T / d)^{-1/2} Y = sqrt(d) polar(Y)
    for y in (g[:150], g[:, :150]):
        z = gram_power_apply(y.unsqueeze(0), -0.5, 3)[0]
        assert rel(z / 3 ** 0.5, polar(y)) < 1e-4


@pytest.mark.parametrize("shape", [(160, 200), (200, 160)])
def test_rank_deficient_gradient_stays_bounded(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(1)
    m, n = shape
    g = torch.randn(m, 3, generator=gen) @ torch.randn(3, n, generator=gen)  # rank 3, float32 rounding
    target = polar(g, 3)
    z = gram_power_apply(g.unsqueeze(0), -0.5, 1)[0]
    assert rel(z, target) < 1e-3
    assert abs(z.double().norm().item() ** 2 - 3) < 1e-2  # three unit directions, no spurious ones
    root = root_power((g if m >= n else g.T).unsqueeze(0), -0.5)[0]  # S^{-1/2} = root root^T
    s_inv_half = root.double() @ root.double().T
    side = g.double() @ g.double().T if m >= n else g.double().T @ g.double()
    evals, evecs = torch.linalg.eigh(side)
    top = evecs[:, -3:]
    expected = (top * evals[-3:].rsqrt()) @ top.T
    assert rel(s_inv_half, expected) < 1e-3
