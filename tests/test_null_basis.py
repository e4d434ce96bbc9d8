"""eigen_adam's null_basis="coordinates": the directions an eigendecomposition cannot tell apart get the basis of
their span nearest the coordinate axes. Oracles: a null space spanned by coordinate axes (the answer is those
axes), the Procrustes optimum against random rotations, invariance to the basis eigh returns, and two runs from
initial weights 1e-7 apart."""

from __future__ import annotations

import pytest
import torch

import symo
from symo.optim import Symo
from symo.optim.bases import Eigh
from symo.runtime.linalg import eigh_basis, nearest_coordinate_basis, pivoted_rows

F64 = torch.float64
SPEC = '[spaces]\nr = "signed_perm"\n[params]\nweight = ["r", "_"]\n'


def random_orthogonal(n: int, seed: int) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(n, n, dtype=F64, generator=torch.Generator().manual_seed(seed))).Q


def statistic_with_null_space(n: int, rank: int, seed: int) -> torch.Tensor:
    """G G^T of a random n x rank gradient: rank `rank`, a null space of n - rank generic (not axis) directions."""
    g = torch.randn(n, rank, dtype=F64, generator=torch.Generator().manual_seed(seed))
    return (g @ g.T)[None]


def test_a_null_space_spanned_by_axes_gets_those_axes():
    """A statistic living on coordinates {0, 2, 5} of 8, mixed there by a rotation: its null directions are
    exactly the other five axes, in increasing order, each with sign +1."""
    on, off = [0, 2, 5], [1, 3, 4, 6, 7]
    a = torch.zeros(8, 8, dtype=F64)
    q = random_orthogonal(3, 0)
    a[torch.tensor(on)[:, None], torch.tensor(on)[None, :]] = (q * torch.tensor([3.0, 2.0, 1.0], dtype=F64)) @ q.T
    basis = eigh_basis(a[None], descending=False, null_basis="coordinates")[0]
    assert torch.allclose(basis[:, :5], torch.eye(8, dtype=F64)[:, off], atol=1e-12)
    assert torch.allclose(basis[:, 5:], torch.linalg.eigh(a)[1][:, 5:])  # the range's columns are eigh's


def test_the_basis_depends_on_the_span_alone_and_is_the_procrustes_optimum():
    a = statistic_with_null_space(10, 3, 1)
    evals, evecs = torch.linalg.eigh(a)
    null = evals <= 1e-12 * evals[..., -1:]
    assert int(null.sum()) == 7
    ours = nearest_coordinate_basis(evecs, null)[0][:, :7]
    turned = evecs.clone()
    turned[0][:, :7] = evecs[0][:, :7] @ random_orthogonal(7, 2)
    assert torch.allclose(nearest_coordinate_basis(turned, null)[0][:, :7], ours, atol=1e-12)
    assert torch.allclose(ours.T @ ours, torch.eye(7, dtype=F64), atol=1e-12)
    assert float((a[0] @ ours).abs().max()) < 1e-10 * float(evals.max())
    # no other orthonormal basis of the span is nearer the axes it is paired with (tr(E_J^T B) is largest)
    rows = ours.abs().argmax(dim=0)
    assert torch.equal(rows, rows.sort().values) and len(set(rows.tolist())) == 7
    best = float(ours[rows, torch.arange(7)].sum())
    for seed in range(20):
        other = ours @ random_orthogonal(7, 10 + seed)
        assert float(other[rows, torch.arange(7)].sum()) <= best + 1e-12


def test_the_pivoted_rows_are_those_of_scipys_pivoted_qr():
    import scipy.linalg

    for seed in range(5):
        u = torch.linalg.qr(torch.randn(20, 7, dtype=F64, generator=torch.Generator().manual_seed(seed))).Q
        pivots = scipy.linalg.qr(u.T.numpy(), mode="r", pivoting=True)[1][:7]
        assert pivoted_rows(u) == pivots.tolist()


def test_a_full_rank_statistic_keeps_eighs_basis():
    g = torch.randn(6, 12, dtype=F64, generator=torch.Generator().manual_seed(3))
    a = (g @ g.T)[None].float()
    assert torch.equal(eigh_basis(a, True, "coordinates"), eigh_basis(a, True))


def first_update(null_basis: str, relative: float, preset: str = "soap") -> torch.Tensor:
    """A 24 x 4 layer (its 24-side statistic has rank 4 after one gradient) at its first update (SOAP's second
    step), its initial weights multiplied by (1 + relative N(0, 1))."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 24, bias=False)
    with torch.no_grad():
        layer.weight.mul_(1 + relative * torch.randn(layer.weight.shape, generator=torch.Generator().manual_seed(9)))
    start = layer.weight.detach().clone()
    opt = Symo(layer.named_parameters(), symo.parse_spec(SPEC), preset=preset, two_sided=True, lr=0.01,
               null_basis=null_basis)
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        x, y = torch.randn(2, 4, generator=gen), torch.randn(2, 24, generator=gen)
        opt.zero_grad()
        ((torch.tanh(layer(x)) - y) ** 2).sum().backward()
        opt.step()
    return (layer.weight.detach() - start).double()


@pytest.mark.parametrize("preset", ["soap", "soap_muon"])
def test_the_first_update_is_fixed_by_the_weights(preset):
    """From initial weights 1e-7 apart the coordinate basis's first updates agree to 1e-3 of their size; eigh's
    basis, which float32 rounding decides, gives first updates that differ by a large part of themselves."""
    gaps = {}
    for null_basis in ("eigh", "coordinates"):
        a, b = first_update(null_basis, 0.0, preset), first_update(null_basis, 1e-7, preset)
        gaps[null_basis] = float((a - b).norm() / a.norm())
    assert gaps["coordinates"] < 1e-3, gaps
    assert gaps["eigh"] > 0.05, gaps


def trajectory_gap(relative: float, **options) -> float:
    """A float64 tanh MLP (8-8-8-4, its true spec: one hidden matrix is a 64-wide block whose statistic gains
    rank one per step) trained 5 steps by two-sided SOAP refreshed every other step, once as is and once with
    every gradient entry multiplied by 1 + relative x noise: the largest entrywise gap, over the parameter's
    largest entry."""
    from symo.train.models import MLP

    def run(noise: float) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = MLP((8, 8, 8, 4)).double()
        opt = Symo(model.named_parameters(), "mlp_tanh", lr=0.02, preset="soap", stats_dtype="float64",
                   precondition_frequency=2, **options)
        gen = torch.Generator().manual_seed(5)
        for step in range(5):
            data = torch.Generator().manual_seed(1000 + step)
            x, y = torch.randn(8, 8, generator=data, dtype=F64), torch.randn(8, 4, generator=data, dtype=F64)
            model.zero_grad()
            (model(x) - y).square().mean().backward()
            for p in model.parameters():
                p.grad.mul_(1 + noise * torch.randn(p.shape, generator=gen, dtype=F64))
            opt.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    a, b = run(0.0), run(relative)
    return max(float((a[n] - b[n]).abs().max() / a[n].abs().max()) for n in a)


def test_with_eigh_refreshes_the_coordinate_basis_makes_the_whole_run_independent_of_rounding():
    """Gradients 1e-15 apart: with refresh=Eigh() and the coordinate basis every refresh takes the same basis, so
    the runs stay 1e-10 apart. A QR refresh of a rank-deficient statistic turns the columns beyond its rank into
    normalised rounding noise, so with SOAP's QR refreshes the runs end percents apart, coordinate basis or not
    (the options' documentation says so)."""
    assert trajectory_gap(1e-15, refresh=Eigh(), null_basis="coordinates") < 1e-10
    assert trajectory_gap(1e-15, null_basis="coordinates") > 1e-3
    assert trajectory_gap(1e-15) > 1e-3


@pytest.mark.parametrize("options", [{"preset": "soap_muon"}, {"preset": "soap", "refresh": Eigh()}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_coordinate_basis_never_makes_a_nan(dtype, options):
    """Rank-2-of-12 statistics whose gradients span 1e-6..1e3, in the user's dtype: 25 steps stay finite (with
    Eigh() every refresh takes the coordinate basis again)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(12, 12, bias=False).to(dtype)
    opt = Symo(layer.named_parameters(), symo.parse_spec(SPEC), precondition_frequency=2, null_basis="coordinates",
               **options)
    for t in range(25):
        u, v = torch.randn(12, 2), torch.randn(2, 12)
        layer.weight.grad = ((u * torch.tensor([1e3, 1e-6])) @ v * (10.0 ** (t % 5 - 2))).to(dtype)
        opt.step()
        assert bool(torch.isfinite(layer.weight).all()), t


def test_an_unknown_null_basis_is_refused_by_name():
    layer = torch.nn.Linear(4, 4, bias=False)
    with pytest.raises((ValueError, TypeError), match="null_basis"):
        Symo(layer.named_parameters(), symo.parse_spec(SPEC), preset="soap", null_basis="random")
