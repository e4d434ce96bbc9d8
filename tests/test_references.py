"""Tests of the reference optimizers against closed forms (polar factors, Shampoo roots)."""

from __future__ import annotations

import pytest
import torch
from helpers import polar
from references import ReferenceMuon, ReferenceShampoo, matrix_power_psd, newton_schulz

D = torch.float64


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(seed))


def with_condition(m: int, n: int, cond: float, seed: int) -> torch.Tensor:
    """An m x n matrix with singular values spread evenly in [1, cond]."""
    k = min(m, n)
    u, _ = torch.linalg.qr(randn(m, k, seed=seed))
    v, _ = torch.linalg.qr(randn(n, k, seed=seed + 1))
    return u @ torch.diag(torch.linspace(1.0, cond, k, dtype=D)) @ v.T


# ---------------------------------------------------------------------------------------------
# Newton-Schulz and Muon
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8, 16), (16, 8), (12, 12)])
def test_quintic_singular_values_and_polar(shape: tuple[int, int]) -> None:
    g = with_condition(*shape, cond=3.0, seed=1)
    x = newton_schulz(g)
    assert x.dtype == torch.float32 and x.shape == g.shape
    sv = torch.linalg.svdvals(x.double())
    assert sv.min() > 0.6 and sv.max() < 1.2
    # Same singular vectors as the exact polar factor: only the singular values are off.
    err = torch.linalg.norm(x.double() - polar(g)) / torch.linalg.norm(polar(g))
    assert err < 0.35


def test_cubic_newton_schulz_converges_to_polar() -> None:
    g = with_condition(6, 9, cond=4.0, seed=2)
    x = newton_schulz(g, steps=60, coeffs=(1.5, -0.5, 0.0), dtype=D)
    torch.testing.assert_close(x, polar(g), rtol=0, atol=1e-10)


def test_newton_schulz_scale_invariant_and_transpose_equivariant() -> None:
    g = randn(5, 7, seed=3)
    torch.testing.assert_close(newton_schulz(g, dtype=D), newton_schulz(100 * g, dtype=D), atol=1e-6, rtol=0)
    torch.testing.assert_close(newton_schulz(g.T, dtype=D), newton_schulz(g, dtype=D).T, atol=1e-12, rtol=0)


def muon_direction(g: torch.Tensor) -> torch.Tensor:
    """Closed-form target: polar factor scaled by sqrt(max(1, rows/cols))."""
    return polar(g) * max(1.0, g.shape[0] / g.shape[1]) ** 0.5


@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
def test_muon_first_step(shape: tuple[int, int]) -> None:
    """First step: u is a multiple of g, so p1 = p0 (1 - lr wd) - lr s NS(g) ~ ... polar(g)."""
    lr, wd = 0.1, 0.01
    p = torch.nn.Parameter(randn(*shape, seed=4).float())
    p0 = p.detach().clone()
    g = with_condition(*shape, cond=2.0, seed=5)
    p.grad = g.float()
    opt = ReferenceMuon([p], lr=lr, weight_decay=wd)
    opt.step()
    scale = max(1.0, shape[0] / shape[1]) ** 0.5
    expected = p0 * (1 - lr * wd) - lr * scale * newton_schulz(g)
    torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-6)
    step = (p0 * (1 - lr * wd) - p.detach()).double() / lr
    assert torch.linalg.norm(step - muon_direction(g)) / torch.linalg.norm(muon_direction(g)) < 0.35
    torch.testing.assert_close(p.grad, g.float())  # the gradient is left alone


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_momentum_two_steps(nesterov: bool) -> None:
    """Classic form: b2 = beta g1 + g2; u2 = g2 + beta b2 (nesterov) or b2."""
    beta, lr = 0.9, 0.5
    g1, g2 = randn(4, 6, seed=6), randn(4, 6, seed=7)
    p = torch.nn.Parameter(torch.zeros(4, 6, dtype=D))
    opt = ReferenceMuon([p], lr=lr, momentum=beta, nesterov=nesterov, dtype=D)
    p.grad = g1.clone()
    opt.step()
    after1 = p.detach().clone()
    p.grad = g2.clone()
    opt.step()
    b2 = beta * g1 + g2
    u2 = g2 + beta * b2 if nesterov else b2
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], (1 - beta) * b2)
    torch.testing.assert_close(after1 - p.detach(), lr * newton_schulz(u2, dtype=D), atol=1e-6, rtol=0)


def test_muon_rejects_vectors() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    with pytest.raises(ValueError):
        ReferenceMuon([p]).step()


# ---------------------------------------------------------------------------------------------
# Shampoo
# ---------------------------------------------------------------------------------------------


def run_shampoo(grads: list[torch.Tensor], lr: float = 1.0, **kw: object) -> tuple[torch.Tensor, ReferenceShampoo]:
    """Apply ReferenceShampoo to a zero parameter; return (minus the summed steps, optimizer)."""
    p = torch.nn.Parameter(torch.zeros_like(grads[0]))
    opt = ReferenceShampoo([p], lr=lr, **kw)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return -p.detach(), opt


@pytest.mark.parametrize("shape", [(5, 5), (4, 7), (7, 4)])
@pytest.mark.parametrize("one_sided", [False, True])
def test_shampoo_single_gradient_is_polar(shape: tuple[int, int], one_sided: bool) -> None:
    """(G G^T)^{-1/4} G (G^T G)^{-1/4} = G (G^T G)^{-1/2} = U V^T."""
    g = with_condition(*shape, cond=3.0, seed=8)
    d, _ = run_shampoo([g], eps=1e-14, one_sided=one_sided)
    torch.testing.assert_close(d, polar(g), rtol=0, atol=1e-6)


def test_shampoo_sum_and_ema_conventions() -> None:
    g = with_condition(4, 6, cond=2.0, seed=9)
    # Sum: the same gradient twice gives L = 2 G G^T, R = 2 G^T G; the second step is U V^T/sqrt2.
    d, opt = run_shampoo([g, g], eps=1e-14)
    torch.testing.assert_close(d, polar(g) * (1 + 2**-0.5), rtol=0, atol=1e-6)
    p = opt.param_groups[0]["params"][0]
    torch.testing.assert_close(opt.state[p]["L"], 2 * g @ g.T)
    # EMA without bias correction: L = (1 - beta2) G G^T, D = U V^T / sqrt(1 - beta2).
    d, _ = run_shampoo([g], eps=1e-14, beta2=0.99)
    torch.testing.assert_close(d, polar(g) / 0.01**0.5, rtol=0, atol=1e-5)
    # With bias correction the first step is U V^T again.
    d, _ = run_shampoo([g], eps=1e-14, beta2=0.99, bias_correction=True)
    torch.testing.assert_close(d, polar(g), rtol=0, atol=1e-6)


@pytest.mark.parametrize("one_sided", [False, True])
def test_shampoo_eps_is_absolute_at_root_time(one_sided: bool) -> None:
    """G = diag(s): both variants give d_i = s_i / sqrt(s_i^2 + eps)."""
    s = torch.tensor([3.0, 1.0, 0.1], dtype=D)
    eps = 0.05
    d, _ = run_shampoo([torch.diag(s)], eps=eps, one_sided=one_sided)
    torch.testing.assert_close(d, torch.diag(s / (s**2 + eps).sqrt()))


def test_shampoo_vector_and_momentum() -> None:
    g = randn(5, seed=10)
    d, _ = run_shampoo([g], eps=0.0)
    # Full-matrix -1/2 power of g g^T (rank one, pseudo-inverse) applied to g: g / ||g||.
    torch.testing.assert_close(d, g / g.norm())
    # Heavy-ball on the preconditioned direction: the second step is U V^T/sqrt2 + 0.5 U V^T.
    m = with_condition(3, 3, cond=2.0, seed=11)
    d, _ = run_shampoo([m, m], eps=1e-14, momentum=0.5)
    torch.testing.assert_close(d, polar(m) * (1 + 2**-0.5 + 0.5), rtol=0, atol=1e-6)


def test_matrix_power_psd_closed_form() -> None:
    q, _ = torch.linalg.qr(randn(4, 4, seed=12))
    evals = torch.tensor([16.0, 1.0, 0.0, 0.0625], dtype=D)
    m = q @ torch.diag(evals) @ q.T
    expected = q @ torch.diag(torch.tensor([0.5, 1.0, 0.0, 2.0], dtype=D)) @ q.T
    torch.testing.assert_close(matrix_power_psd(m, -0.25), expected)
    damped = (evals + 0.1) ** -0.5
    torch.testing.assert_close(matrix_power_psd(m, -0.5, eps=0.1), q @ torch.diag(damped) @ q.T)
