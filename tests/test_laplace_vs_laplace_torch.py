"""SymoLaplace against laplace-torch (an optional extra: `pip install -e '.[laplace]'`; skipped without it).

With a spec whose group moves nothing, the projection is the identity and SymoLaplace must reproduce
laplace-torch's FullLaplace: this pins the scaling convention (sums over the data, regression with
1/2 ||f - y||^2 and sigma_noise) to the reference implementation's numbers.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from cases import make_problem
from helpers import max_rel

import symo
from symo.laplace import SymoLaplace

D = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread_module")  # tiny float64 work: one torch thread

pytest.importorskip("laplace")


FULL_SPEC = '[spaces]\n[params]\n"fc{i}.weight" = ["_", "_"]\n"fc{i}.bias" = ["_"]\n'


@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_same_numbers_as_laplace_torch_when_the_group_is_trivial(likelihood):
    """With a group that moves nothing the projection is the identity and SymoLaplace is laplace-torch's
    FullLaplace: the same precision, marginal likelihood and GLM predictive (the scaling convention)."""
    from laplace import Laplace
    from laplace.curvature import CurvlinopsEF
    from torch.utils.data import DataLoader, TensorDataset

    model, x, y, loader = make_problem((3, 4, 4, 3), "relu", likelihood)
    sigma = 0.6 if likelihood == "regression" else 1.0
    spec = symo.parse_spec(FULL_SPEC)
    la = SymoLaplace(model, spec, likelihood, estimator="ggn_exact", sigma_noise=sigma, prior_precision=0.7)
    la.fit(loader)
    assert [b.name for b in la.blocks] == ["trivial"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = Laplace(model, likelihood, subset_of_weights="all", hessian_structure="full", sigma_noise=sigma,
                      prior_precision=0.7)
        ref.fit(DataLoader(TensorDataset(x, y), batch_size=10))
        xt = torch.randn(4, 3, dtype=D, generator=torch.Generator().manual_seed(1))
        theirs = ref(xt, pred_type="glm", link_approx="probit")
    assert max_rel(la.posterior_precision_dense(), ref.posterior_precision.double()) < 1e-6
    assert abs(float(la.log_marginal_likelihood()) - float(ref.log_marginal_likelihood())) < 1e-6
    ours = la.predictive(xt, pred_type="glm", link_approx="probit")
    if likelihood == "regression":
        assert max_rel(ours[0], theirs[0]) < 1e-12 and max_rel(ours[1], theirs[1]) < 1e-6
    else:
        assert max_rel(ours, theirs) < 1e-6
    # the empirical Fisher: the same for classification; laplace-torch 0.3's regression EF is twice ours
    # (it squares gradients of the unhalved squared error, then halves), ours is the EF of 1/2 ||f - y||^2
    ef = SymoLaplace(model, spec, likelihood, estimator="ef", sigma_noise=sigma, prior_precision=0.7)
    ef.fit(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_ef = Laplace(model, likelihood, subset_of_weights="all", hessian_structure="full", sigma_noise=sigma,
                         prior_precision=0.7, backend=CurvlinopsEF)
        ref_ef.fit(DataLoader(TensorDataset(x, y), batch_size=10))
    factor = 2.0 if likelihood == "regression" else 1.0
    eye = 0.7 * torch.eye(la.n_params, dtype=D)
    theirs_ef = ref_ef.posterior_precision.double() - eye
    assert max_rel(factor * (ef.posterior_precision_dense() - eye), theirs_ef) < 1e-6
