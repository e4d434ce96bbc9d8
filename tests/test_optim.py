"""`symo.optim.Symo` against independently written references (tests/references.py) and closed forms.

Cases of docs/theory.md §5: Muon, hidden-to-hidden, factored gauge, Shampoo. float64 unless
said. Everything here is small: the file runs in a few seconds.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from cases import MLP2_SPEC, sensing_loss
from helpers import rel
from optim_cases import COLS, FACTORED, HIDDEN, MUON, ROWS, first_update, one_step_update, regression, train
from references import ReferenceMuon, ReferenceShampoo  # noqa: E402

from symo.optim import Symo, SymoConfig
from symo.runtime.linalg import geometric_mean, inv_sqrt_newton_schulz, sym_power
from symo.train.models import MLP, Factored


# ------------------------------------------------------------------------------------------ Muon
def test_muon_newton_schulz_matches_reference_muon():
    """float32, Nesterov, Muon's quintic and scale: 10 steps against ReferenceMuon + torch AdamW."""
    torch.manual_seed(0)
    m1 = MLP((8, 16, 12, 4))
    m2 = copy.deepcopy(m1)
    opt = Symo(m1.named_parameters(), MUON, lr=0.02, backend="newton_schulz", update_scale="muon",
               weight_decay=0.01, adamw_lr=0.01, adamw_wd=0.01)
    assert opt.assignment == {"fc1.weight": "symo", "fc1.bias": "adamw", "fc2.weight": "symo",
                              "fc2.bias": "adamw", "fc3.weight": "symo", "fc3.bias": "adamw"}
    assert "AdamW: fc1.bias, fc2.bias, fc3.bias" in opt.describe()
    weights = [p for n, p in m2.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in m2.named_parameters() if n.endswith("bias")]
    refs = [ReferenceMuon(weights, lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.01),
            torch.optim.AdamW(biases, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)]
    train(m1, [opt], regression(m1, torch.float32), 10)
    train(m2, refs, regression(m2, torch.float32), 10)
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert rel(a.detach(), b.detach()) < 1e-6, n


def test_muon_exact_backend_is_scaled_polar_factor():
    """eigh backend, natural scale, no momentum or damping: the update is sqrt(rows) U V^T."""
    grads, upd = first_update(MUON, backend="eigh")
    for n in ("fc1.weight", "fc2.weight", "fc3.weight"):
        u, _, vh = torch.linalg.svd(grads[n], full_matrices=False)
        expected = math.sqrt(grads[n].shape[0]) * u @ vh
        assert rel(upd[n], expected) < 1e-10, n


# ------------------------------------------------------------------------------------------ Shampoo
def _shampoo_pair(one_sided: bool, beta2: float | None, eps: float, shapes=(8, 16, 12, 4)):
    torch.manual_seed(0)
    m1 = MLP(shapes, bias=False).double()
    m2 = copy.deepcopy(m1)
    ref = ReferenceShampoo(m2.parameters(), lr=0.01, eps=eps, beta2=beta2,
                           bias_correction=beta2 is not None, one_sided=one_sided)
    return m1, m2, ref


@pytest.mark.parametrize("beta2", [None, 0.9])
def test_one_sided_shampoo(beta2):
    """Rows spec accumulated (sum or bias-corrected EMA), power -1/2: G (R + eps)^{-1/2}.

    S = R / rows, so absolute damping eps / rows gives sqrt(rows) (R + eps)^{-1/2}: every layer has 12
    rows, and the groups' lr / sqrt(12) divides the natural scale out (per-group options at work).
    """
    rows, eps = 12, 1e-6
    m1, m2, ref = _shampoo_pair(True, beta2, eps, shapes=(8, rows, rows, rows))
    groups = [{"params": [(n, p)], "lr": 0.01 / math.sqrt(p.shape[0])} for n, p in m1.named_parameters()]
    opt = Symo(groups, ROWS, preconditioner="root", beta1=0.0, beta2=1.0 if beta2 is None else beta2,
               statistic="gradient",
               damping=eps / rows, damping_mode="absolute", backend="eigh")
    train(m1, [opt], regression(m1), 10)
    train(m2, [ref], regression(m2), 10)
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert rel(a.detach(), b.detach()) < 1e-5, n


@pytest.mark.parametrize("beta2", [None, 0.9])
def test_two_sided_shampoo_square_with_damping(beta2):
    """Geometric mean of the rows and columns specs: L^{-1/4} G R^{-1/4} with a real epsilon.

    Square n x n layers: S1 = R / n, S2 = L / n, so absolute damping eps / n on each reproduces
    (L + eps)^{-1/4} G (R + eps)^{-1/4} exactly, and the muon scale divides out n^{1/4} n^{1/4}.
    """
    n, eps = 10, 1e-3
    m1, m2, ref = _shampoo_pair(False, beta2, eps, shapes=(8, n, n, n))
    m1.fc1.weight.requires_grad_(False)  # 10 x 8 is not square: leave it out of the comparison
    m2.fc1.weight.requires_grad_(False)
    opt = Symo(m1.named_parameters(), ROWS, preconditioner="root", lr=0.01, geometric_mean_with=COLS, beta1=0.0,
               beta2=1.0 if beta2 is None else beta2, statistic="gradient", damping=eps / n,
               damping_mode="absolute", update_scale="muon")
    assert "# 'Shampoo column group (left factor)'" in opt.describe()
    train(m1, [opt], regression(m1), 10)
    train(m2, [ref], regression(m2), 10)
    for (name, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert rel(a.detach(), b.detach()) < 1e-5, name


def test_two_sided_shampoo_rectangular():
    """Rectangular layers, negligible epsilon: natural scale (rows cols)^{1/4}, divided out per group."""
    eps = 1e-15
    m1, m2, ref = _shampoo_pair(False, None, eps)
    groups = [{"params": [(n, p)], "lr": 0.01 / (p.shape[0] * p.shape[1]) ** 0.25}
              for n, p in m1.named_parameters()]
    opt = Symo(groups, ROWS, preconditioner="root", geometric_mean_with=COLS, beta1=0.0, beta2=1.0,
               statistic="gradient",
               damping=eps, damping_mode="absolute")
    train(m1, [opt], regression(m1), 10)
    train(m2, [ref], regression(m2), 10)
    for (name, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert rel(a.detach(), b.detach()) < 1e-5, name


# ------------------------------------------------------------------------------------------ gauge
def test_factored_update_is_gram_determined():
    """One step: sqrt(k) (Y Y^T)^{-1/2} Y with Y = [G_U; G_V], pseudo-inverse by a dense eigh."""
    torch.manual_seed(0)
    model = Factored(10, 8, 3).double()
    loss = sensing_loss()
    loss(model).backward()
    y = torch.cat([model.U.grad, model.V.grad]).clone()
    model.zero_grad()
    opt = Symo(model.named_parameters(), FACTORED, lr=0.1, beta1=0.0, damping=0.0)
    upd = one_step_update(model, opt, lambda: loss(model))
    evals, evecs = torch.linalg.eigh(y @ y.T)
    keep = evals > 1e-10 * evals.max()
    inv_sqrt = (evecs[:, keep] * evals[keep].rsqrt()) @ evecs[:, keep].T
    expected = math.sqrt(3) * inv_sqrt @ y
    assert rel(torch.cat([upd["U"], upd["V"]]), expected) < 1e-10


def test_hidden_to_hidden_is_normalised_gradient():
    """Both sides signed_perm: sqrt(h1 h2) G / ||G|| for every weight matrix."""
    grads, upd = first_update(HIDDEN)
    for n in ("fc1.weight", "fc2.weight", "fc3.weight"):
        g = grads[n]
        assert rel(upd[n], math.sqrt(g.numel()) * g / g.norm()) < 1e-12, n


# ------------------------------------------------------------------------------------------ estimators
def test_taylor_reduces_to_gradient_estimator_when_weights_are_isotropic():
    """W^T W = s^2 I gives S_w = c I with c = s^2 / rows, so H = (S_g / c)^{1/2}: the taylor update is
    sqrt(c) times the gradient estimator's."""
    torch.manual_seed(0)
    model = MLP((4, 8, 8, 8), bias=False).double()
    scales = {}
    with torch.no_grad():
        for i, (n, p) in enumerate(model.named_parameters()):
            q, _ = torch.linalg.qr(torch.randn(p.shape[0], p.shape[1], dtype=torch.float64))
            p.copy_((0.5 + i) * q)
            scales[n] = (0.5 + i) ** 2 / p.shape[0]
    x = torch.randn(32, 4, dtype=torch.float64)  # full-rank, well-conditioned gradients
    updates = {}
    for kind in ("root", "taylor"):
        m = copy.deepcopy(model)
        opt = Symo(m.named_parameters(), MUON, preconditioner=kind, lr=0.1, beta1=0.0, beta2=0.5, damping=0.0)
        updates[kind] = one_step_update(m, opt, lambda m=m: m(x).square().sum())
    for n, c in scales.items():
        assert rel(updates["taylor"][n], math.sqrt(c) * updates["root"][n]) < 1e-7, n


def test_geometric_mean_solves_riccati():
    gen = torch.Generator().manual_seed(0)
    x, z = torch.randn(5, 5, generator=gen, dtype=torch.float64), torch.randn(5, 5, generator=gen,
                                                                                 dtype=torch.float64)
    a, b = x @ x.T + 0.1 * torch.eye(5, dtype=torch.float64), z @ z.T
    h = geometric_mean(torch.linalg.inv(a), b)   # H = A^{-1} # B solves H A H = B
    assert rel(h @ a @ h, b) < 1e-10 and rel(h, h.T) < 1e-12


def test_inverse_root_newton_schulz_matches_eigh():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 12, 30, generator=gen, dtype=torch.float64)
    a = x @ x.transpose(-1, -2) / 30
    for absolute in (False, True):
        exact = sym_power(a, -0.5, 1e-2, absolute=absolute) if absolute else None
        approx = inv_sqrt_newton_schulz(a, 40, 1e-2, absolute=absolute)
        if absolute:
            assert rel(approx, exact) < 1e-10
        assert rel(approx @ approx @ (a + _ns_shift(a, 1e-2, absolute)), torch.eye(12).expand(3, 12, 12)) < 1e-8


def _ns_shift(a, damping, absolute):
    eye = torch.eye(a.shape[-1], dtype=a.dtype)
    return damping * eye if absolute else damping * a.norm(dim=(-2, -1), keepdim=True) * eye


def test_newton_schulz_backend_for_stored_statistics():
    """Absolute damping: the newton_schulz backend takes eigh (the iteration converges to (A + damping I)^{-1/2}
    and cannot map zeros to zero, as the absolute convention does), so both backends agree bit for bit.
    (The iteration itself: tests/test_optim_backends.py.)"""
    torch.manual_seed(0)
    m1 = MLP((8, 16, 12, 4)).double()
    m2 = copy.deepcopy(m1)
    kw = dict(preconditioner="root", lr=0.01, beta2=0.9, damping=1e-4, damping_mode="absolute")
    o1 = Symo(m1.named_parameters(), MUON, backend="eigh", **kw)
    o2 = Symo(m2.named_parameters(), MUON, backend="newton_schulz", ns_inverse_steps=40, **kw)
    train(m1, [o1], regression(m1), 3)
    train(m2, [o2], regression(m2), 3)
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(b.detach(), a.detach()), n


def test_config_validation_and_group_options():
    assert SymoConfig().kind == "polar" and SymoConfig().power == -0.5
    with pytest.raises(TypeError, match="beta2 is not an option of preconditioner 'polar'.*root"):
        SymoConfig(beta2=0.9)
    model = MLP((8, 16, 12, 4))
    with pytest.raises(ValueError, match="newton_schulz"):
        Symo(model.named_parameters(), MUON, backend="newton_schulz", power=-0.25)
    with pytest.raises(ValueError, match="per-group options"):
        Symo([{"params": list(model.named_parameters()), "beta2": 0.9}], MUON)
    with pytest.raises(TypeError, match="named parameters"):
        Symo(model.parameters(), MUON)


# fc3.bias on the trivial group: a block no space moves
PERM_SPEC = MLP2_SPEC.format(h1="perm", h2="perm") + '"fc3.bias" = ["_"]\n'


@pytest.mark.parametrize("options", [dict(), dict(preconditioner="taylor", beta2=0.9, damping=1e-4),
                                     dict(preconditioner="root", beta2=0.99, precondition_frequency=2)])
def test_parsed_and_compiled_spec_inputs_with_perm_trivial_block(options):
    """perm spaces couple layers and give a trivial block (the permutation MLP); taylor falls back to
    S_g there. A parsed Spec and a CompiledSpec are both accepted."""
    import symo

    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4)).double()
    spec = symo.parse_spec(PERM_SPEC)
    compiled = symo.compile(spec, model, disk_cache=False)
    assert "trivial" in [b.name for b in compiled.blocks]
    for s in (spec, compiled):
        m = copy.deepcopy(model)
        opt = Symo(m.named_parameters(), s, lr=1e-2, **options)
        assert set(opt.assignment.values()) == {"symo"}
        loss_fn = regression(m)
        first = float(loss_fn().detach())
        train(m, [opt], loss_fn, 10)
        assert float(loss_fn().detach()) < first


def test_adamw_update_scale_has_rms_target():
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4)).double()
    opt = Symo(model.named_parameters(), MUON, lr=0.1, beta1=0.0, update_scale="adamw", adamw_rms=0.2)
    upd = one_step_update(model, opt, regression(model))
    for n in ("fc1.weight", "fc2.weight", "fc3.weight"):
        assert float(upd[n].square().mean().sqrt()) == pytest.approx(0.2, rel=1e-10), n
