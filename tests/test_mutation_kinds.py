"""The kinds' edges that the other tests leave open (found by mutation testing of symo/optim/kinds/ -- base,
polar, root, taylor, published, eigen_adam, then_orthogonalize --, the refresh configs of
symo/optim/matrix_function_configs.py and linalg's eigh_basis / power_qr_basis), each against an independent
oracle: a dense float64 eigh, a closed form, the SVD polar factor, pytorch-optimizer's SOAP, the same step on
separate parameters, or the documented contract of a validation message, an error message, the size cap
`max_precond_dim` (a block is diagonal when `mult > cap`) or a refresh schedule.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import COLS, ROWS, assert_polar_of_the_librarys_direction, loss_grad, singular_values_of_updates

import symo
from symo.optim import Eigh, PowerQR, Symo
from symo.optim.kinds.eigen_adam import EigenAdamConfig
from symo.optim.kinds.root import RootConfig
from symo.optim.kinds.then_orthogonalize import ThenOrthogonalizeConfig
from symo.runtime.linalg import eigh_basis, power_qr_basis

F64 = torch.float64


# ------------------------------------------------------------------ bases.PowerQR: its validation
@pytest.mark.parametrize("iterations", [1, 2, 7])
def test_power_qr_accepts_every_int_iteration_count_from_one(iterations):
    assert PowerQR(iterations=iterations).iterations == iterations
    assert PowerQR().iterations == 1 and PowerQR().lift is None  # built here, not at import


@pytest.mark.parametrize("iterations", [0, -1, True, 1.0, 2.5, "2"])
def test_power_qr_refuses_an_iteration_count_that_is_not_an_int_from_one(iterations):
    with pytest.raises(ValueError) as err:
        PowerQR(iterations=iterations)
    assert str(err.value) == f"PowerQR.iterations must be an int >= 1, got {iterations!r}"


@pytest.mark.parametrize("lift", [None, 0, 0.0, 1e-8, 0.5, 1, 3.0])
def test_power_qr_accepts_no_lift_or_any_number_from_zero(lift):
    assert PowerQR(lift=lift).lift == lift


@pytest.mark.parametrize("lift", [-1e-8, -1, "0.1", [1e-8]])
def test_power_qr_refuses_a_negative_or_non_numeric_lift(lift):
    with pytest.raises(ValueError) as err:
        PowerQR(lift=lift)
    assert str(err.value) == f"PowerQR.lift must be None or a number >= 0, got {lift!r}"


# ------------------------------------------------------------------ linalg: eigh_basis and power_qr_basis
@pytest.mark.parametrize("descending", [False, True])
def test_eigh_basis_orders_the_columns_by_eigenvalue(descending):
    """Against a matrix built from known eigenpairs (distinct eigenvalues): column j is the eigenvector of the
    j-th smallest (descending: largest) eigenvalue, up to sign, in the statistic's dtype."""
    torch.manual_seed(0)
    q0, _ = torch.linalg.qr(torch.randn(2, 5, 5, dtype=F64))
    evals = torch.tensor([[0.5, 4.0, 1.0, 3.0, 2.0], [9.0, -1.0, 0.0, 7.0, 5.0]], dtype=F64)
    a = (q0 * evals.unsqueeze(-2)) @ q0.transpose(-1, -2)
    for dtype in (F64, torch.float32):
        basis = eigh_basis(a.to(dtype), descending=descending)
        assert basis.dtype == dtype
        order = torch.argsort(evals, dim=-1, descending=descending)
        want = q0.gather(-1, order.unsqueeze(-2).expand_as(q0))
        overlap = (basis.double().transpose(-1, -2) @ want).abs()
        assert float((overlap - torch.eye(5, dtype=F64)).abs().max()) < (1e-10 if dtype == F64 else 1e-5)


def test_one_power_qr_refresh_is_one_qr_of_the_product_with_the_sorted_columns():
    """With the default `iterations` (one), the new basis Q and B = A P (P: the previous columns sorted by
    descending diag(P^T A P)) satisfy B = Q R with R upper triangular, i.e. Q^T B is upper triangular; a second
    iteration would give an upper-triangular Q^T A (A P) instead, which Q^T B is not."""
    torch.manual_seed(1)
    q0, _ = torch.linalg.qr(torch.randn(6, 6, dtype=F64))
    a = (q0 * torch.tensor([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], dtype=F64)) @ q0.T
    previous, _ = torch.linalg.qr(torch.randn(1, 6, 6, dtype=F64))
    order = torch.argsort(torch.diagonal(previous[0].T @ a @ previous[0]), descending=True)
    b = a @ previous[0][:, order]
    for q in (power_qr_basis(a[None], previous)[0][0], power_qr_basis(a[None], previous, iterations=1)[0][0]):
        assert float((q.T @ q - torch.eye(6, dtype=F64)).abs().max()) < 1e-12
        lower = torch.tril(q.T @ b, diagonal=-1)
        assert float(lower.abs().max()) < 1e-12 * float(b.abs().max())
    twice = power_qr_basis(a[None], previous, iterations=2)[0][0]
    assert float(torch.tril(twice.T @ b, diagonal=-1).abs().max()) > 1e-3 * float(b.abs().max())


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("lift", [None, 0.0, 1e-3])
def test_power_qr_lift_is_the_documented_shift(dtype, lift):
    """A = diag(1, 0) and a previous basis rotated by theta (its first column has the larger estimate cos^2):
    the first new column is (A + c I) p_1 normalised, with c = max(lift, min(64 n eps, 1/8)) cos^2 theta
    (no shift without a lift), so its entries' ratio is c tan(theta) / (1 + c): a closed form."""
    theta = 0.3
    cos, sin = math.cos(theta), math.sin(theta)
    previous = torch.tensor([[[cos, -sin], [sin, cos]]], dtype=dtype)
    a = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]], dtype=dtype)
    q, order = power_qr_basis(a, previous, lift=lift)
    assert order.tolist() == [[0, 1]]
    ratio = float(q[0, 1, 0] / q[0, 0, 0])
    if lift is None:
        assert ratio == 0.0
        return
    c = max(lift, min(64 * 2 * torch.finfo(dtype).eps, 0.125)) * cos ** 2
    assert abs(ratio / (c * math.tan(theta) / (1 + c)) - 1) < 1e-4


# ------------------------------------------------------------------ validation messages, whole
def test_two_sided_with_a_second_spec_is_refused_with_its_message():
    with pytest.raises(ValueError) as err:
        EigenAdamConfig(two_sided=True, geometric_mean_with=symo.parse_spec(COLS))
    assert str(err.value) == ("two_sided=True takes the other side from the same spec; geometric_mean_with= takes it "
                              "from a second spec: pass one of them")


def test_an_inner_root_on_another_backend_is_refused_with_its_message():
    with pytest.raises(ValueError) as err:
        ThenOrthogonalizeConfig(inner=RootConfig(backend="newton_schulz"))
    assert str(err.value) == ("inner: then_orthogonalize's inner root takes its power by eigh (backend='eigh'); the "
                              "backend option of then_orthogonalize is the polar factor's")


# ------------------------------------------------------------------ then_orthogonalize: the polar factor
def test_auto_backend_takes_the_exact_polar_factor_up_to_eigh_max_size_and_the_quintic_above():
    """A square 5 x 5 weight: backend='auto' with eigh_max_size=5 is the exact polar factor (every singular value
    of the update is Muon's scale, 1, to rounding); with eigh_max_size=4 it is Muon's quintic, whose singular
    values spread over about [0.7, 1.2]; backend='newton_schulz' spreads at any eigh_max_size. `describe()` names
    the backend each block got."""
    values, backend = singular_values_of_updates(backend="auto", eigh_max_size=5)
    assert backend == "eigh"
    for s in values:
        assert float((s - 1).abs().max()) < 1e-10, s
    for options in ({"backend": "auto", "eigh_max_size": 4}, {"backend": "newton_schulz", "eigh_max_size": 5}):
        values, backend = singular_values_of_updates(**options)
        assert backend.startswith("newton_schulz"), (options, backend)
        assert max(float(s.max() - s.min()) for s in values) > 1e-2, options


def test_adamw_update_scale_matches_the_update_rms_to_adamw_rms():
    """update_scale='adamw': each step's update (weight decay 0) has RMS lr * adamw_rms over the weight's entries
    (Moonlight's matching; the polar factor's own RMS would be 1 / sqrt(5) for a 5 x 5 weight)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 5, dtype=F64))
    target = torch.randn(5, 5, dtype=F64)
    opt = Symo({"w": w}, symo.parse_spec(ROWS), preset="then_orthogonalize", lr=0.1, backend="eigh",
               update_scale="adamw", adamw_rms=0.3, weight_decay=0.0, stats_dtype="float64")
    for _ in range(3):
        loss_grad(w, target)
        before = w.detach().clone()
        opt.step()
        rms = float((before - w.detach()).square().mean().sqrt())
        assert abs(rms / (0.1 * 0.3) - 1) < 1e-10, rms


def test_an_inner_power_changed_mid_run_refreshes_once_then_keeps_the_schedule():
    """PMuon (frequency 10): the power changed after step 3 is taken at step 4 (a forced refresh of the inner
    root), and the root then stays as it is until the scheduled refresh after step 10, while its EMA moves."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 4, dtype=F64))
    target = torch.randn(6, 4, dtype=F64)
    opt = Symo({"w": w}, symo.parse_spec(ROWS), preset="then_orthogonalize", lr=0.05, precondition_frequency=10,
               backend="eigh", stats_dtype="float64")
    snapshots = []
    for t in range(1, 8):
        if t == 4:
            opt.config.preconditioner.inner.power = -0.6
        loss_grad(w, target)
        opt.step()
        (block,) = opt.block_statistics().values()
        snapshots.append({k: v.clone() for k, v in block.items() if isinstance(v, torch.Tensor)})
    assert not torch.equal(snapshots[3]["precond"], snapshots[2]["precond"])  # the forced refresh at step 4
    for t in (4, 5, 6):  # steps 5..7: the precondition is kept, the statistic is not
        assert torch.equal(snapshots[t]["precond"], snapshots[3]["precond"]), t + 1
        ema = next(k for k in snapshots[t] if k not in ("precond", "step"))
        assert not torch.equal(snapshots[t][ema], snapshots[t - 1][ema]), t + 1


def test_soap_muon_with_a_second_spec_is_the_polar_factor_of_soaps_direction():
    """then_orthogonalize with the SOAP inner and the width side from a second spec (geometric_mean_with=): the
    first step only builds the statistics (and moves nothing), and until the first refresh (frequency 10) each
    update is lr polar(N), N pytorch-optimizer's SOAP direction from the same gradients (as for two_sided=True in
    tests/test_soap.py; the two forms differ only once a refresh must carry Adam's second moment)."""
    pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 5, dtype=F64))
    twin = torch.nn.Parameter(w.detach().clone())
    opt = Symo({"w": w}, symo.parse_spec(ROWS), preset="then_orthogonalize", inner="eigen_adam",
               geometric_mean_with=symo.parse_spec(COLS), nesterov=False, backend="eigh", stats_dtype="float64",
               precondition_frequency=10, lr=0.05)
    lib = pytorch_optimizer.SOAP([twin], lr=1.0, weight_decay=0.0, precondition_frequency=10)
    assert_polar_of_the_librarys_direction(opt, lib, w, twin, torch.randn(5, 5, dtype=F64), lr=0.05, steps=8)


# ------------------------------------------------------------------ more edges (a second seeded sample)
def test_drop_null_columns_measures_each_batch_element_against_its_own_largest_eigenvalue():
    """A batch of two full-rank statistics of scales 1 and 1e-20: no direction of either is zero to the
    statistic's precision (the dense float64 eigh's eigenvalues are all above 8 sqrt(n) eps of their own largest),
    so every column is kept; one rank-deficient element drops exactly its null columns."""
    from symo.optim.kinds.eigen_adam import drop_null_columns

    torch.manual_seed(2)
    q0, _ = torch.linalg.qr(torch.randn(3, 4, 4, dtype=F64))
    evals = torch.tensor([[4.0, 3.0, 2.0, 1.0], [4e-20, 3e-20, 2e-20, 1e-20], [5.0, 1.0, 0.0, 0.0]], dtype=F64)
    a = (q0 * evals.unsqueeze(-2)) @ q0.transpose(-1, -2)
    basis = torch.linalg.eigh(a).eigenvectors
    dense = torch.linalg.eigvalsh(a)
    kept = dense > 8 * 2 * torch.finfo(F64).eps * dense.amax(dim=-1, keepdim=True)
    assert kept.tolist() == [[True] * 4, [True] * 4, [False, False, True, True]]
    out = drop_null_columns(basis, a)
    assert torch.equal(out.abs().sum(dim=-2) > 0, kept)
    assert torch.equal(out[kept.unsqueeze(-2).expand_as(out)], basis[kept.unsqueeze(-2).expand_as(basis)])


def test_soap_refreshing_every_step_is_pytorch_optimizers_soap():
    """precondition_frequency=1: the bases are refreshed after every step from the second on (SOAP's schedule),
    against pytorch-optimizer's SOAP, 12 float64 steps on the same random gradients (a fixed loss would give the
    second step the first one's gradient, since the first moves nothing, and its refresh would change nothing)."""
    pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 5, dtype=F64))
    twin = torch.nn.Parameter(w.detach().clone())
    start = w.detach().clone()
    opt = Symo({"w": w}, symo.parse_spec(ROWS), preset="soap", lr=0.01, weight_decay=0.0, precondition_frequency=1,
               stats_dtype="float64")
    lib = pytorch_optimizer.SOAP([twin], lr=0.01, weight_decay=0.0, precondition_frequency=1)
    for t in range(12):
        g = torch.randn(5, 5, dtype=F64) + 0.1 * t
        for p, o in ((w, opt), (twin, lib)):
            p.grad = g.clone()
            o.step()
        if t > 0:  # the first step moves neither
            moved = float((twin.detach() - start).norm())
            assert float((w.detach() - twin.detach()).norm()) < 1e-5 * moved, t


def test_then_orthogonalize_takes_an_inner_kinds_name_for_its_default_config():
    """inner='root' is PMuon's inner step as documented (S^-0.3 of an EMA 0.95 of the raw gradient's statistic, by
    eigh, every 10 steps); inner='eigen_adam' is EigenAdamConfig's defaults; another name is refused."""
    root = ThenOrthogonalizeConfig(inner="root").inner
    assert isinstance(root, RootConfig)
    assert (root.statistic, root.precondition_frequency, root.power, root.backend, root.beta2) == (
        "gradient", 10, -0.3, Eigh(), 0.95)
    assert ThenOrthogonalizeConfig(inner="eigen_adam").inner == EigenAdamConfig()
    assert ThenOrthogonalizeConfig().inner == root
    with pytest.raises(ValueError, match="inner must be 'root', 'eigen_adam', a RootConfig or an EigenAdamConfig, "
                                         "got 'adam'"):
        ThenOrthogonalizeConfig(inner="adam")


def test_power_qr_takes_the_previous_basis_in_the_statistics_dtype():
    torch.manual_seed(3)
    a = torch.randn(1, 4, 4, dtype=F64)
    a = a @ a.transpose(-1, -2)
    previous = torch.linalg.qr(torch.randn(1, 4, 4)).Q  # float32
    q, _ = power_qr_basis(a, previous)
    assert q.dtype == F64
    assert float((q[0].T @ q[0] - torch.eye(4, dtype=F64)).abs().max()) < 1e-12
