"""`symo.laplace` against dense float64 oracles built here, independently of the library's projection.

The oracle: the GGN / empirical Fisher from per-example Jacobians (torch.func.jacrev on the flat
parameter vector), projected onto the commutant by explicit averaging A_g H A_g^T over every element
of the group (enumerated exhaustively by tests/oracles.py, which shares no code with symo), plus the
prior precision. Everything else (log-determinants, inverse roots, predictive variances, marginal
likelihood) is then dense linear algebra on that matrix. Small MLPs, float64.
"""

from __future__ import annotations

import math
import re

import oracles as O
import pytest
import torch
from cases import make_problem
from helpers import max_rel
from torch.func import functional_call, jacrev

import symo
from symo.laplace import SymoLaplace
from symo.train.models import MLP

D = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread_module")  # tiny float64 work: one torch thread


def flat_outputs(model: torch.nn.Module, names: list[str]):
    """f(theta_flat, x) over the parameters `names` (others fixed), the oracle's own flattening."""
    params = dict(model.named_parameters())
    shapes = [tuple(params[k].shape) for k in names]
    fixed = {k: v.detach() for k, v in params.items() if k not in names}
    theta = torch.cat([params[k].detach().reshape(-1) for k in names])

    def f(vec: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out, i = {}, 0
        for k, s in zip(names, shapes):
            out[k] = vec[i:i + math.prod(s)].reshape(s)
            i += math.prod(s)
        return functional_call(model, {**fixed, **out}, (x,))

    return f, theta


def dense_curvature(model, names, x, y, likelihood: str, estimator: str) -> torch.Tensor:
    """Sum over examples of J^T Lambda J (GGN) or g g^T (empirical Fisher), dense P x P."""
    f, theta = flat_outputs(model, names)
    jac = jacrev(f)(theta, x)  # (N, C, P): outputs of the batch in theta
    out = f(theta, x)
    if likelihood == "regression":
        if estimator == "ef":
            g = torch.einsum("nc,ncp->np", out - y, jac)
            return g.T @ g
        return torch.einsum("ncp,ncq->pq", jac, jac)
    p = torch.softmax(out, -1)
    if estimator == "ef":
        g = torch.einsum("nc,ncp->np", p - torch.nn.functional.one_hot(y, p.shape[1]).double(), jac)
        return g.T @ g
    lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    return torch.einsum("ncp,ncd,ndq->pq", jac, lam, jac)


def mlp_layout(sizes, kind: str):
    """The oracle's description of mlp_relu / mlp_tanh (hidden spaces h1, h2)."""
    i, h1, h2, o = sizes
    spaces = {"h1": (kind, h1, None), "h2": (kind, h2, None)}
    layout = [("fc1.weight", (h1, i), ["h1", "_"]), ("fc1.bias", (h1,), ["h1"]),
              ("fc2.weight", (h2, h1), ["h2", "h1"]), ("fc2.bias", (h2,), ["h2"]),
              ("fc3.weight", (o, h2), ["_", "h2"]), ("fc3.bias", (o,), ["_"])]
    return spaces, layout


def project(actions: list[torch.Tensor], h: torch.Tensor) -> torch.Tensor:
    """E_g[A_g H A_g^T] by explicit averaging over every group element."""
    a = torch.stack(actions)
    return (a @ h @ a.transpose(1, 2)).mean(0)


def inv_sqrt(m: torch.Tensor) -> torch.Tensor:
    evals, evecs = torch.linalg.eigh(m)
    return (evecs * evals.rsqrt()) @ evecs.T


CASES = {  # (sizes, act, spec, group kind, likelihood)
    "relu-classification": ((3, 3, 3, 4), "relu", "mlp_relu", "perm", "classification"),
    "tanh-regression": ((3, 2, 3, 2), "tanh", "mlp_tanh", "signed_perm", "regression"),
}


@pytest.fixture(scope="module", params=list(CASES))
def fitted(request):
    sizes, act, spec, kind, likelihood = CASES[request.param]
    model, x, y, loader = make_problem(sizes, act, likelihood)
    sigma = 0.7 if likelihood == "regression" else 1.0
    delta = 0.3
    la = SymoLaplace(model, spec, likelihood, estimator="ggn_exact", prior_precision=delta, sigma_noise=sigma)
    la.fit(loader)
    names = [n for n, _ in model.named_parameters()]
    spaces, layout = mlp_layout(sizes, kind)
    actions = O.action_matrices(spaces, layout)
    h = dense_curvature(model, names, x, y, likelihood, "ggn")
    h_proj = project(actions, h)
    precision = h_proj / sigma ** 2 + delta * torch.eye(len(h), dtype=D)
    return dict(la=la, model=model, x=x, y=y, loader=loader, actions=actions, h=h, h_proj=h_proj,
                precision=precision, delta=delta, sigma=sigma, likelihood=likelihood, names=names)


def test_oracle_projection_is_nontrivial_and_commutes(fitted):
    h, h_proj = fitted["h"], fitted["h_proj"]
    assert max_rel(h_proj, h) > 1e-2  # the group really averages something away
    for a in fitted["actions"][:: max(1, len(fitted["actions"]) // 20)]:
        assert max_rel(a @ h_proj @ a.T, h_proj) < 1e-12


def test_precision_matches_explicit_group_average(fitted):
    la = fitted["la"]
    assert la.param_names == fitted["names"]
    assert max_rel(la.posterior_precision_dense(), fitted["precision"]) < 1e-10
    cov = la.posterior_covariance_dense()
    assert max_rel(cov, torch.linalg.inv(fitted["precision"])) < 1e-9
    curv, diag = la.posterior_precision  # the symo.Curvature view of the same matrix
    assert diag == {} and max_rel(curv.dense(), fitted["precision"]) < 1e-10


def test_log_determinant_is_exact(fitted):
    la = fitted["la"]
    expected = torch.logdet(fitted["precision"])
    assert abs(float(la.log_det_posterior_precision) - float(expected)) < 1e-9 * abs(float(expected)) + 1e-9


def test_samples_are_inverse_root_of_precision(fitted):
    la, precision = fitted["la"], fitted["precision"]
    n = 10000
    draws = la.sample(n, generator=torch.Generator().manual_seed(5))
    z = torch.randn(n, la.n_params, dtype=D, generator=torch.Generator().manual_seed(5))
    exact = la.mean + z @ inv_sqrt(precision)  # the same z through the oracle's P^{-1/2}
    assert max_rel(draws - la.mean, exact - la.mean) < 1e-9
    # and statistically: the draws' covariance is P^{-1} (entries normalised by sqrt(S_ii S_jj))
    cov = torch.linalg.inv(precision)
    emp = torch.cov((draws - la.mean).T, correction=0)
    scale = cov.diagonal().sqrt()
    err = ((emp - cov) / (scale[:, None] * scale[None, :])).abs().max()
    assert float(err) < 6 * math.sqrt(2 / n), float(err)
    assert float((draws.mean(0) - la.mean).abs().div(scale).max()) < 5 / math.sqrt(n)


def test_glm_predictive_variance(fitted):
    la, model, names = fitted["la"], fitted["model"], fitted["names"]
    xt = torch.randn(5, model.fc1.in_features, dtype=D, generator=torch.Generator().manual_seed(9))
    f, theta = flat_outputs(model, names)
    jac = jacrev(f)(theta, xt)
    f_var = jac @ torch.linalg.inv(fitted["precision"]) @ jac.transpose(1, 2)
    assert max_rel(la.functional_variance(xt), f_var) < 1e-9
    out = la.predictive(xt, pred_type="glm", link_approx="probit")
    f_mu = f(theta, xt)
    if fitted["likelihood"] == "regression":
        assert torch.allclose(out[0], f_mu) and max_rel(out[1], f_var) < 1e-9
    else:
        kappa = 1 / torch.sqrt(1 + math.pi / 8 * f_var.diagonal(dim1=1, dim2=2))
        assert max_rel(out, torch.softmax(kappa * f_mu, -1)) < 1e-9


def test_sampled_predictives_use_the_posterior_draws(fitted):
    """glm + mc draws f + J delta (the oracle's Jacobian times the library's samples); nn evaluates f(theta + delta)."""
    la, model, names = fitted["la"], fitted["model"], fitted["names"]
    xt = torch.randn(4, model.fc1.in_features, dtype=D, generator=torch.Generator().manual_seed(2))
    f, theta = flat_outputs(model, names)
    deltas = la.sample(50, generator=torch.Generator().manual_seed(3)) - la.mean
    nn_draws = torch.stack([f(theta + d, xt) for d in deltas])
    nn = la.predictive(xt, pred_type="nn", link_approx="mc", n_samples=50, generator=torch.Generator().manual_seed(3))
    if fitted["likelihood"] == "regression":  # (mean, variance) of the draws, as laplace-torch
        assert max_rel(nn[0], nn_draws.mean(0)) < 1e-10 and max_rel(nn[1], nn_draws.var(0)) < 1e-10
        return
    assert max_rel(nn, torch.softmax(nn_draws, -1).mean(0)) < 1e-10
    jac = jacrev(f)(theta, xt)
    expected = torch.softmax(f(theta, xt)[None] + torch.einsum("ncp,sp->snc", jac, deltas), -1).mean(0)
    got = la.predictive(xt, pred_type="glm", link_approx="mc", n_samples=50, generator=torch.Generator().manual_seed(3))
    assert max_rel(got, expected) < 1e-10


def oracle_log_marglik(fitted, delta: float | torch.Tensor, sigma: float) -> torch.Tensor:
    """log p(D | theta*) - 1/2 (log det P - log det P_0 + delta |theta*|^2), dense; delta may be a grid."""
    model, names = fitted["model"], fitted["names"]
    f, theta = flat_outputs(model, names)
    out = f(theta, fitted["x"])
    p = len(theta)
    if fitted["likelihood"] == "classification":
        loglik = -torch.nn.functional.cross_entropy(out, fitted["y"], reduction="sum")
    else:
        r = out - fitted["y"]
        loglik = (-0.5 * (r ** 2).sum() / sigma ** 2 - r.numel() * math.log(sigma * math.sqrt(2 * math.pi)))
    delta = torch.as_tensor(delta, dtype=D).reshape(-1, 1)
    evals = torch.linalg.eigvalsh(fitted["h_proj"] / sigma ** 2)  # log det (H + delta I) for every delta at once
    logdet = torch.log(evals[None, :] + delta).sum(1)
    return (loglik - 0.5 * (logdet - p * torch.log(delta[:, 0]) + delta[:, 0] * (theta @ theta))).squeeze(0)


def test_log_marginal_likelihood_and_its_gradient(fitted):
    la, delta, sigma = fitted["la"], fitted["delta"], fitted["sigma"]
    value = float(la.log_marginal_likelihood(prior_precision=delta, sigma_noise=None))
    assert abs(value - float(oracle_log_marglik(fitted, delta, sigma))) < 1e-9 * abs(value)
    # d/d log(delta): autograd against central finite differences of the oracle
    log_d = torch.tensor(math.log(delta), dtype=D, requires_grad=True)
    la.log_marginal_likelihood(prior_precision=log_d.exp()).backward()
    eps = 1e-5
    fd = float(oracle_log_marglik(fitted, math.exp(log_d.item() + eps), sigma)
               - oracle_log_marglik(fitted, math.exp(log_d.item() - eps), sigma)) / (2 * eps)
    assert abs(float(log_d.grad) - fd) < 1e-6 * max(1.0, abs(fd))
    # per-block prior precision: gradient of each block's log delta against finite differences of the library
    groups = len(la.prior_groups)
    base = torch.full((groups,), math.log(delta), dtype=D)
    vec = base.clone().requires_grad_(True)
    la.log_marginal_likelihood(prior_precision=vec.exp()).backward()
    for i in range(groups):
        step = torch.zeros(groups, dtype=D)
        step[i] = eps
        fd_i = (float(la.log_marginal_likelihood(prior_precision=(base + step).exp()))
                - float(la.log_marginal_likelihood(prior_precision=(base - step).exp()))) / (2 * eps)
        assert abs(float(vec.grad[i]) - fd_i) < 1e-6 * max(1.0, abs(fd_i))
    assert abs(float(vec.grad.sum()) - fd) < 1e-6 * max(1.0, abs(fd))  # the blocks add up to the scalar
    if fitted["likelihood"] == "regression":  # and in sigma_noise
        s = torch.tensor(sigma, dtype=D, requires_grad=True)
        la.log_marginal_likelihood(prior_precision=delta, sigma_noise=s).backward()
        fd_s = float(oracle_log_marglik(fitted, delta, sigma + eps)
                     - oracle_log_marglik(fitted, delta, sigma - eps)) / (2 * eps)
        assert abs(float(s.grad) - fd_s) < 1e-6 * max(1.0, abs(fd_s))
    la.prior_precision, la.sigma_noise = delta, sigma


def test_optimize_prior_precision_finds_the_oracle_maximum(fitted):
    la, sigma = fitted["la"], fitted["sigma"]
    la.optimize_prior_precision(method="marglik", n_steps=300, lr=0.05)
    found = float(la.prior_precision)
    grid = torch.logspace(-3, 3, 601, dtype=D)
    best = float(grid[int(oracle_log_marglik(fitted, grid, sigma).argmax())])
    assert abs(math.log(found) - math.log(best)) < 0.03
    la.prior_precision = fitted["delta"]


@pytest.mark.parametrize("estimator", ["ef", "ggn_mc"])
def test_other_estimators(estimator):
    sizes = (3, 3, 3, 4)
    model, x, y, loader = make_problem(sizes, "relu", "classification")
    mc = 1000 if estimator == "ggn_mc" else 1
    la = SymoLaplace(model, "mlp_relu", estimator=estimator, mc_samples=mc, prior_precision=0.5, chunk_size=8)
    la.fit(loader, generator=torch.Generator().manual_seed(0))
    names = [n for n, _ in model.named_parameters()]
    actions = O.action_matrices(*mlp_layout(sizes, "perm"))
    h = project(actions, dense_curvature(model, names, x, y, "classification", "ef" if estimator == "ef" else "ggn"))
    got = la.posterior_precision_dense() - 0.5 * torch.eye(la.n_params, dtype=D)
    # exact for the empirical Fisher; Monte Carlo over 1000 labels an example: ~1% (measured 0.6-1.1% over 5 seeds)
    assert max_rel(got, h) < (1e-10 if estimator == "ef" else 0.04)


def test_last_layer_subset():
    sizes = (3, 3, 3, 4)
    model, x, y, loader = make_problem(sizes, "relu", "classification")
    la = SymoLaplace(model, "mlp_relu", subset="last_layer", estimator="ggn_exact", prior_precision=0.2)
    la.fit(loader)
    names = ["fc3.weight", "fc3.bias"]
    assert la.param_names == names
    spaces = {"h2": ("perm", 3, None)}
    layout = [("fc3.weight", (4, 3), ["_", "h2"]), ("fc3.bias", (4,), ["_"])]
    h = project(O.action_matrices(spaces, layout), dense_curvature(model, names, x, y, "classification", "ggn"))
    precision = h + 0.2 * torch.eye(16, dtype=D)
    assert max_rel(la.posterior_precision_dense(), precision) < 1e-10
    # the subset's block of the whole network's projected curvature is the same matrix
    whole = SymoLaplace(model, "mlp_relu", estimator="ggn_exact", prior_precision=0.2)
    whole.fit(loader)
    assert max_rel(whole.posterior_precision_dense()[-16:, -16:], precision) < 1e-10
    xt = torch.randn(3, 3, dtype=D)
    f, theta = flat_outputs(model, names)
    jac = jacrev(f)(theta, xt)
    assert max_rel(la.functional_variance(xt), jac @ torch.linalg.inv(precision) @ jac.transpose(1, 2)) < 1e-9


def test_inferred_spec_with_an_uncovered_parameter_gets_a_diagonal():
    sizes = (3, 3, 3, 4)
    model, x, y, loader = make_problem(sizes, "relu", "classification")
    spec = symo.infer_spec(model, x[:2])
    la = SymoLaplace(model, spec, estimator="ggn_exact", prior_precision=0.4)
    la.fit(loader)
    assert list(la.uncovered) == ["fc3.bias"]  # the inferred spec leaves the output bias out
    names = [n for n, _ in model.named_parameters()]
    h = dense_curvature(model, names, x, y, "classification", "ggn")
    spaces, layout = mlp_layout(sizes, "perm")
    covered = layout[:-1]
    k = O.param_size(covered)
    expected = torch.zeros_like(h)
    expected[:k, :k] = project(O.action_matrices(spaces, covered), h[:k, :k])
    expected[k:, k:] = torch.diag(h.diagonal()[k:])
    expected += 0.4 * torch.eye(len(h), dtype=D)
    assert max_rel(la.posterior_precision_dense(), expected) < 1e-10
    assert abs(float(la.log_det_posterior_precision) - float(torch.logdet(expected))) < 1e-9


def test_errors_name_the_problem():
    model, x, y, loader = make_problem((3, 3, 3, 4), "relu", "classification")
    with pytest.raises(ValueError, match="likelihood"):
        SymoLaplace(model, "mlp_relu", "poisson")
    with pytest.raises(ValueError, match="did you mean"):
        SymoLaplace(model, "mlp_relu", subset=["fc3.weigth"])
    la = SymoLaplace(model, "mlp_relu")
    with pytest.raises(RuntimeError, match="fit"):
        la.log_marginal_likelihood()
    with pytest.raises(ValueError, match="one per block"):
        la.prior_precision = torch.ones(7)
    with pytest.raises(ValueError, match="sigma_noise"):
        SymoLaplace(model, "mlp_relu", sigma_noise=2.0)
    with pytest.raises(TypeError, match=r"spec is None; pass the model's symmetry spec: symo.infer_spec\(model\)"):
        SymoLaplace(model, None)
    with pytest.raises(ValueError, match="n_samples must be a positive int, got 0"):
        la.sample(0)
    wider = symo.compile("mlp_relu", MLP((3, 5, 3, 4), act="relu").double(), disk_cache=False)
    with pytest.raises(ValueError, match=re.escape("the compiled spec does not fit these parameters (fc1.weight: "
                                                   "compiled (5, 3), here (3, 3)")):
        SymoLaplace(model, wider)
    (bx, by), = loader[:1]
    bad_batches = {"(x, y) pairs of tensors, got a dict with keys ['x', 'y']": [{"x": bx, "y": by}],
                   "the model failed on a batch x of shape (10, 2) and dtype torch.float64": [(bx[:, :-1], by)],
                   "the model failed on a batch x of shape (10, 3) and dtype torch.float32 (its parameters are "
                   "torch.float64)": [(bx.float(), by)],
                   "class indices of shape (10,) and an integer dtype; got shape (10,) and torch.float64":
                       [(bx, by.double())],
                   "got shape (10, 1) and torch.int64 (e.g. y.long(), or y.squeeze(-1))": [(bx, by[:, None])]}
    for message, bad in bad_batches.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            la.fit(bad)
    la.fit(loader)
    with pytest.raises(ValueError, match="pred_type must be one of"):
        la.predictive(x, pred_type="laplace")
    with pytest.raises(ValueError, match="link_approx must be one of"):
        la.predictive(x, link_approx="bridge")
    with pytest.raises(ValueError, match="pred_type='nn' needs link_approx='mc'"):
        la.predictive(x, pred_type="nn", link_approx="probit")

