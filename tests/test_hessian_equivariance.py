"""The library's group action against dense torch.func Hessians in float64 (docs/theory.md §2).

For a true symmetry, Hess L(A_g w) = A_g Hess L(w) A_g^T, with A_g the dense matrix of
`CompiledSpec.act` (built column by column here) and the Hessians from torch.func (tests/oracles.py).
A relaxed group (Muon's per-matrix rows on the same network) breaks the identity by a wide margin, and
`symo.check_symmetry` tells the two apart the same way.
"""

from __future__ import annotations

from pathlib import Path

import oracles_dense as OD  # noqa: E402
import pytest
import torch
from helpers import rel
from torch.func import functional_call

import symo
from symo.train.models import MLP

SPECS = Path(__file__).resolve().parent.parent / "specs"


def dense_action(compiled: symo.CompiledSpec, element, names, shapes) -> torch.Tensor:
    """The P x P matrix of w -> A_g w, from the library's `act` applied to every basis vector."""
    sizes = [torch.Size(shapes[n]).numel() for n in names]
    cols = []
    for j in range(sum(sizes)):
        e = torch.zeros(sum(sizes), dtype=torch.float64)
        e[j] = 1.0
        parts = dict(zip(names, (x.reshape(shapes[n]) for n, x in zip(names, e.split(sizes)))))
        moved = compiled.act(element, parts)
        cols.append(torch.cat([moved[n].reshape(-1) for n in names]))
    return torch.stack(cols, dim=1)


@pytest.mark.parametrize("spec,true_symmetry", [("mlp_tanh", True), ("muon", False)])
def test_hessian_transforms_with_the_group_action(spec, true_symmetry):
    torch.manual_seed(0)
    model = MLP((3, 4, 3, 2)).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(10, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(10, 2, generator=gen, dtype=torch.float64)
    w = {n: p.detach().clone() for n, p in model.named_parameters()}
    names, shapes = list(w), {n: t.shape for n, t in w.items()}

    def loss(params):
        return ((functional_call(model, params, (x,)) - y) ** 2).mean()

    compiled = symo.compile(SPECS / f"{spec}.toml", model, disk_cache=False)
    element = compiled.random_element(torch.Generator().manual_seed(2))
    a = dense_action(compiled, element, names, shapes)
    assert torch.allclose(a @ a.T, torch.eye(len(a), dtype=torch.float64), atol=1e-12)   # orthogonal
    moved = compiled.act(element, w)
    h, h_moved = OD.dense_hessian(loss, w, names), OD.dense_hessian(loss, moved, names)
    error = rel(h_moved, a @ h @ a.T)
    report = symo.check_symmetry(loss, compiled, w)
    if true_symmetry:
        assert error < 1e-12 and report.is_true_symmetry
    else:
        assert error > 1e-2 and not report.is_true_symmetry
