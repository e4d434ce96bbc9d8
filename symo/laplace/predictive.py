"""Predictive pieces for `symo.laplace`, usable with any Gaussian posterior over a subset of parameters.

- `jacobians`: J(x) per example, {name: (N, C, *shape)} (torch.func.jacrev under vmap);
- `linearized_outputs`: f(x; theta*) + J(x) delta_s for a batch of parameter offsets delta_s, by
  forward-mode products (`torch.func.jvp`) without forming J. With delta_s drawn from the posterior
  these are exact draws from the GLM predictive N(f, J Sigma J^T), at the cost of ~3 forward passes
  a sample: the route `predictive(..., pred_type="glm", link_approx="mc")` takes, and the one the
  benchmark uses for every posterior, laplace-torch's included;
- `nn_outputs`: f(x; theta* + delta_s), the sampled network ("nn") predictive;
- `probit`: the probit approximation softmax(f / sqrt(1 + pi/8 diag(Sigma_f))), as laplace-torch;
- `PRED_TYPES`, `LINK_APPROX` and `check_predictive_options`: the predictive's options and their check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch.func import functional_call, jacrev, jvp, vmap

Tensors = Mapping[str, torch.Tensor]
PRED_TYPES = ("glm", "nn")
LINK_APPROX = ("probit", "mc")


def check_predictive_options(pred_type: str, link_approx: str) -> None:
    """A ValueError naming the option unless (pred_type, link_approx) is a predictive `SymoLaplace` offers."""
    if pred_type not in PRED_TYPES:
        raise ValueError(f"pred_type must be one of {PRED_TYPES}, got {pred_type!r}")
    if link_approx not in LINK_APPROX:
        raise ValueError(f"link_approx must be one of {LINK_APPROX}, got {link_approx!r}")
    if pred_type == "nn" and link_approx != "mc":
        raise ValueError("pred_type='nn' needs link_approx='mc'")


def jacobians(model: torch.nn.Module, params: dict[str, torch.Tensor], frozen: dict[str, torch.Tensor],
              x: torch.Tensor) -> dict[str, torch.Tensor]:
    """{name: (N, C, *shape)}: the Jacobian of each example's outputs in the parameters `params`."""

    def one(xi: torch.Tensor) -> dict[str, torch.Tensor]:
        def f(p: dict[str, torch.Tensor]) -> torch.Tensor:
            return functional_call(model, {**frozen, **p}, (xi.unsqueeze(0),)).squeeze(0)

        return jacrev(f)(params)

    return vmap(one)(x)


def linearized_outputs(model: torch.nn.Module, params: dict[str, torch.Tensor], frozen: dict[str, torch.Tensor],
                       x: torch.Tensor, deltas: Tensors) -> torch.Tensor:
    """(S, N, C): f(x; theta*) + J(x) delta_s for offsets {name: (S, *shape)} of the parameters in `params`."""

    def f(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return functional_call(model, {**frozen, **p}, (x,))

    def one(delta: dict[str, torch.Tensor]) -> torch.Tensor:
        out, tangent_out = jvp(f, (params,), ({n: delta[n].to(params[n].dtype) for n in params},))
        return out + tangent_out

    return vmap(one)(dict(deltas))


def nn_outputs(model: torch.nn.Module, params: dict[str, torch.Tensor], frozen: dict[str, torch.Tensor],
               x: torch.Tensor, deltas: Tensors) -> torch.Tensor:
    """(S, N, C): the network evaluated at theta* + delta_s."""

    def one(delta: dict[str, torch.Tensor]) -> torch.Tensor:
        moved = {n: params[n] + delta[n].to(params[n].dtype) for n in params}
        return functional_call(model, {**frozen, **moved}, (x,))

    return vmap(one)(dict(deltas))


def probit(f_mu: torch.Tensor, f_var: torch.Tensor) -> torch.Tensor:
    """softmax(kappa * f_mu) with kappa = 1 / sqrt(1 + pi/8 * diag(f_var)); f_var is (N, C, C) or (N, C)."""
    diag = f_var.diagonal(dim1=-2, dim2=-1) if f_var.dim() == 3 else f_var
    return torch.softmax(f_mu / torch.sqrt(1.0 + math.pi / 8 * diag), dim=-1)


__all__ = ["LINK_APPROX", "PRED_TYPES", "check_predictive_options", "jacobians", "linearized_outputs", "nn_outputs",
           "probit"]
