"""`symo.laplace.SymoLaplace`: a Laplace approximation whose posterior precision is Symo's orbit-averaged curvature.

    la = symo.laplace.SymoLaplace(model, "mlp_relu", likelihood="classification")
    la.fit(train_loader)                                  # batches (x, y); sums over the data
    la.optimize_prior_precision(method="marglik")         # Adam on log prior precision, as laplace-torch
    probs = la.predictive(x, pred_type="glm", link_approx="probit")

The posterior is N(theta_MAP, P^{-1}) over the chosen parameters (`subset`, default all), with

    P = H / (sigma_noise^2 T) + delta,

H the curvature estimate projected onto the commutant of the spec's group (the orbit average of
docs/theory.md, one small factor per isotypic block, computed by the spec's own `gather`) and delta
the prior precision: a scalar, or one value per block (and one for the uncovered parameters). On
block lambda, P is (A_lambda + delta_lambda I) (x) I_d, so its eigenvalues, log-determinant and every
power come from one eigendecomposition of each mult x mult factor: exact, and cheap to redo for any
prior precision. Parameters of the subset that the spec does not cover get the diagonal of the same
curvature estimate (a diagonal Laplace on them).

Estimators (`estimator=`; details in `symo.laplace.fitting`): `"ggn"` (default) is the generalised
Gauss-Newton matrix, exact up to EXACT_GGN_MAX_OUTPUTS outputs and Monte Carlo (`mc_samples` labels
drawn from the model's predictive per example) above; `"ggn_exact"`, `"ggn_mc"` force one route;
`"ef"` is the empirical Fisher. The GGN is the default because it is the curvature laplace-torch uses
by default and is, for these likelihoods, the Fisher: the empirical Fisher squares the gradients at
the MAP, which are small on well-fit data, so it under-estimates curvature there and is biased where
they are not; Monte Carlo GGN with one label per example costs what the empirical Fisher costs.

Scaling convention: laplace-torch's (sums over the data; regression with the unit-noise loss
1/2 sum ||f - y||^2 and sigma_noise applied as above). Interface: laplace-torch's `fit`,
`log_marginal_likelihood(prior_precision, sigma_noise)`, `optimize_prior_precision`, `sample`,
`predictive` / `__call__`. See docs/laplace.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..compiler import Spec
from ..runtime.compiled import CompiledSpec
from ..runtime.curvature import Curvature
from .fitting import (
    CurvatureAccumulator,
    batch_loss,
    batch_pair,
    check_arguments,
    check_targets,
    check_tiling,
    compile_for_subset,
    eigh_psd,
    model_outputs,
    output_cotangents,
    pseudo_gradients,
    resolve_estimator,
    resolve_subset,
)
from .predictive import check_predictive_options, jacobians, linearized_outputs, nn_outputs, probit

# refuse factors beyond this many stored numbers: a block that large means the group is too small
MAX_FACTOR_NUMBERS = 1 << 28


class SymoLaplace:
    """Laplace approximation with a symmetry-structured posterior precision (module docstring)."""

    def __init__(self, model: torch.nn.Module, spec: Spec | str | Path | CompiledSpec,
                 likelihood: str = "classification", *, subset: str | Sequence[str] | None = None,
                 estimator: str = "ggn", mc_samples: int = 1, prior_precision: float | torch.Tensor = 1.0,
                 sigma_noise: float | torch.Tensor = 1.0, prior_mean: float = 0.0, temperature: float = 1.0,
                 sizes: dict[str, int] | None = None, chunk_size: int = 32) -> None:
        check_arguments(spec, likelihood, estimator, mc_samples, sigma_noise)
        self.model, self.likelihood, self.estimator = model, likelihood, estimator
        self.mc_samples, self.temperature, self.chunk_size = mc_samples, float(temperature), int(chunk_size)
        self.prior_mean = float(prior_mean)
        named = dict(model.named_parameters())
        self.param_names = resolve_subset(model, named, subset)
        chosen = set(self.param_names)
        self._params = {n: named[n].detach() for n in self.param_names}
        self._frozen = {n: p.detach() for n, p in named.items() if n not in chosen}
        self._frozen.update({n: b for n, b in model.named_buffers()})
        self.shapes = {n: tuple(p.shape) for n, p in self._params.items()}
        self.compiled = compile_for_subset(spec, named, self.shapes, subset is None or subset == "all", sizes)
        covered = set(self.compiled.param_names) if self.compiled is not None else set()
        self.uncovered = {n: self.shapes[n] for n in self.param_names if n not in covered}
        self.blocks = list(self.compiled.blocks) if self.compiled is not None else []
        check_tiling(self.compiled)
        numbers = sum(b.batch * b.mult * b.mult for b in self.blocks)
        if numbers > MAX_FACTOR_NUMBERS:
            big = max(self.blocks, key=lambda b: b.mult)
            raise ValueError(f"the posterior factors would hold {numbers:,} numbers (block {big.id} {big.name!r} has "
                             f"mult {big.mult}); use a larger group in the spec or a smaller subset")
        self.prior_groups = [b.id for b in self.blocks] + (["uncovered"] if self.uncovered else [])
        self.n_params = sum(math.prod(s) for s in self.shapes.values())
        self.mean = self.flatten(self._params).detach()
        self.prior_precision = prior_precision
        self.sigma_noise = sigma_noise
        self.H_factors: dict[str, torch.Tensor] | None = None
        self.H_diag: dict[str, torch.Tensor] = {}
        self.loss, self.n_data, self.n_outputs = 0.0, 0, 0
        self.estimator_used: str | None = None  # the concrete estimator fit() ran ("ggn" resolved)

    # ------------------------------------------------------------------ parameters of the posterior
    @property
    def prior_precision(self) -> torch.Tensor:
        """(1,) for a scalar prior precision, or (len(prior_groups),): blocks in order, then the uncovered."""
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value: float | torch.Tensor) -> None:
        t = _float64(value).reshape(-1)
        if t.numel() not in (1, len(self.prior_groups)):
            raise ValueError(f"prior_precision must be a scalar or hold {len(self.prior_groups)} values (one per "
                             f"block {self.prior_groups}), got {t.numel()}")
        if bool((t.detach() <= 0).any()):
            raise ValueError(f"prior_precision must be positive, got {t.detach().tolist()}")
        self._prior_precision = t

    @property
    def sigma_noise(self) -> torch.Tensor:
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value: float | torch.Tensor) -> None:
        t = _float64(value).reshape(())
        if float(t.detach()) <= 0:
            raise ValueError(f"sigma_noise must be positive, got {float(t.detach())}")
        self._sigma_noise = t

    def _deltas(self) -> torch.Tensor:
        return self._prior_precision.expand(len(self.prior_groups)) if self._prior_precision.numel() == 1 \
            else self._prior_precision

    def _h_scale(self) -> torch.Tensor:
        return 1.0 / (self._sigma_noise ** 2 * self.temperature)

    # ------------------------------------------------------------------ flattening (model order)
    def flatten(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """(..., P): the subset's tensors concatenated in `param_names` order, each row-major."""
        lead = tensors[self.param_names[0]].shape[:len(tensors[self.param_names[0]].shape)
                                                  - len(self.shapes[self.param_names[0]])]
        return torch.cat([tensors[n].reshape(*lead, -1) for n in self.param_names], dim=-1)

    def unflatten(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inverse of `flatten`; leading dimensions are kept."""
        if vec.shape[-1] != self.n_params:
            raise ValueError(f"vector of length {vec.shape[-1]}; this posterior has {self.n_params} parameters")
        out, i = {}, 0
        for n in self.param_names:
            k = math.prod(self.shapes[n])
            out[n] = vec[..., i:i + k].reshape(*vec.shape[:-1], *self.shapes[n])
            i += k
        return out

    # ------------------------------------------------------------------ fit
    def fit(self, train_loader: Iterable, progress_bar: bool = False,
            generator: torch.Generator | None = None) -> None:
        """Sum the curvature estimate over `train_loader`'s batches (x, y) at the current parameters (MAP)."""
        self.model.eval()
        self._params = {n: p.detach() for n, p in self.model.named_parameters() if n in self.shapes}
        self.mean = self.flatten(self._params).detach()
        device = self.mean.device
        acc = CurvatureAccumulator(self.compiled, self.uncovered, device)
        loss, n_data = torch.zeros((), dtype=torch.float64), 0
        for batch in tqdm(train_loader, desc="symo laplace fit", disable=not progress_bar, leave=False):
            x, y = (t.to(device) for t in batch_pair(batch))
            out = model_outputs(self.model, {**self._frozen, **self._params}, x)
            check_targets(out, y, self.likelihood)
            self.n_outputs = out.shape[-1]
            est = resolve_estimator(self.estimator, self.n_outputs)
            loss += batch_loss(out, y, self.likelihood).double()
            for s in range(0, x.shape[0], self.chunk_size):
                cot = output_cotangents(out[s:s + self.chunk_size], y[s:s + self.chunk_size], self.likelihood, est,
                                        self.mc_samples, generator)
                vecs = pseudo_gradients(self.model, self._params, self._frozen, x[s:s + self.chunk_size], cot)
                acc.add({n: v.reshape(-1, *self.shapes[n]) for n, v in vecs.items()})
            n_data += x.shape[0]
        if n_data == 0:
            raise ValueError("fit: train_loader yielded no data")
        self.H_factors, self.H_diag = acc.factors, acc.diag
        self.loss, self.n_data = loss, n_data
        self.estimator_used = resolve_estimator(self.estimator, self.n_outputs)
        self._eig = {b: eigh_psd(a) for b, a in self.H_factors.items()}
        centred = {n: (p - self.prior_mean).double() for n, p in self._params.items()}
        self._mean_sq = self._block_norms(centred)

    def _check_fit(self) -> None:
        if self.H_factors is None:
            raise RuntimeError("SymoLaplace is not fitted: call fit(train_loader) first")

    def _block_norms(self, v: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """||C_lambda v||^2 per prior group: the squared norm of v's part in each block (and the uncovered)."""
        out = []
        if self.compiled is not None:
            ys = self.compiled.gather({n: v[n] for n in self.compiled.param_names})
            out += [(ys[b.id].double() ** 2).sum() for b in self.blocks]
        if self.uncovered:
            out.append(sum((v[n].double() ** 2).sum() for n in self.uncovered))
        return torch.stack(out)

    def _group_sizes(self) -> torch.Tensor:
        sizes = [b.batch * b.mult * b.dim for b in self.blocks]
        if self.uncovered:
            sizes.append(sum(math.prod(s) for s in self.uncovered.values()))
        return torch.tensor(sizes, dtype=torch.float64)

    # ------------------------------------------------------------------ marginal likelihood
    @property
    def log_likelihood(self) -> torch.Tensor:
        """log p(D | theta_MAP) under laplace-torch's convention (differentiable in sigma_noise)."""
        self._check_fit()
        ll = -self._h_scale() * self.loss
        if self.likelihood == "regression":
            ll = ll - self.n_data * self.n_outputs * torch.log(self._sigma_noise * math.sqrt(2 * math.pi))
        return ll

    @property
    def log_det_posterior_precision(self) -> torch.Tensor:
        """log det P, exactly: sum over blocks of d_lambda * sum log(eigenvalue of A_lambda + delta_lambda)."""
        self._check_fit()
        deltas, s, total = self._deltas(), self._h_scale(), torch.zeros((), dtype=torch.float64)
        for i, b in enumerate(self.blocks):
            total = total + b.dim * torch.log(self._eig[b.id][0] * s + deltas[i]).sum()
        for n in self.uncovered:
            total = total + torch.log(self.H_diag[n] * s + deltas[-1]).sum()
        return total

    @property
    def log_det_prior_precision(self) -> torch.Tensor:
        return (self._group_sizes() * torch.log(self._deltas())).sum()

    @property
    def log_det_ratio(self) -> torch.Tensor:
        return self.log_det_posterior_precision - self.log_det_prior_precision

    @property
    def scatter(self) -> torch.Tensor:
        """(theta_MAP - mu_0)^T P_0 (theta_MAP - mu_0)."""
        self._check_fit()
        return (self._deltas() * self._mean_sq).sum()

    def log_marginal_likelihood(self, prior_precision: float | torch.Tensor | None = None,
                                sigma_noise: float | torch.Tensor | None = None) -> torch.Tensor:
        """log p(D) ~ log p(D | theta*) - 1/2 (log det P - log det P_0 + scatter); sets the arguments given,
        as laplace-torch does. Differentiable in both (pass tensors that require grad)."""
        if prior_precision is not None:
            self.prior_precision = prior_precision
        if sigma_noise is not None:
            if self.likelihood != "regression":
                raise ValueError("sigma_noise can only be set for likelihood='regression'")
            self.sigma_noise = sigma_noise
        return self.log_likelihood - 0.5 * (self.log_det_ratio + self.scatter)

    def optimize_prior_precision(self, method: str = "marglik", pred_type: str | None = None, n_steps: int = 100,
                                 lr: float = 1e-1, init_prior_prec: float | torch.Tensor = 1.0,
                                 prior_structure: str = "scalar", verbose: bool = False) -> torch.Tensor:
        """Maximise the marginal likelihood over log prior precision by Adam (laplace-torch's recipe).

        `prior_structure`: "scalar" or "block" (one value per prior group); a tensor `init_prior_prec`
        keeps its own structure. `pred_type` is accepted for laplace-torch compatibility and unused.
        """
        if method != "marglik":
            raise ValueError(f"only method='marglik' is implemented, got {method!r}")
        if prior_structure not in ("scalar", "block"):
            raise ValueError(f"prior_structure must be 'scalar' or 'block', got {prior_structure!r}")
        self._check_fit()
        init = _float64(init_prior_prec).reshape(-1)
        if init.numel() == 1 and prior_structure == "block":
            init = init.expand(len(self.prior_groups)).clone()
        log_prec = init.log().clone().requires_grad_(True)
        opt = torch.optim.Adam([log_prec], lr=lr)
        for _ in range(n_steps):
            opt.zero_grad()
            (-self.log_marginal_likelihood(prior_precision=log_prec.exp())).backward()
            opt.step()
        self.prior_precision = log_prec.detach().exp()
        if verbose:
            print(f"optimized prior precision: {self.prior_precision.tolist()}")
        return self.prior_precision

    # ------------------------------------------------------------------ the posterior as an operator
    def apply_precision_power(self, v: Mapping[str, torch.Tensor], p: float) -> dict[str, torch.Tensor]:
        """P^p v for {name: (S, *shape)} (a leading sample dimension), blockwise in float64."""
        self._check_fit()
        deltas, s = self._deltas().detach(), float(self._h_scale().detach())
        out: dict[str, torch.Tensor] = {}
        if self.compiled is not None:
            ys = torch.func.vmap(self.compiled.gather)({n: v[n].double() for n in self.compiled.param_names})
            new = {}
            for i, b in enumerate(self.blocks):
                evals, evecs = self._eig[b.id]
                f = (evals * s + deltas[i]) ** p                                  # (batch, mult)
                z = torch.einsum("bkm,sbkw->sbmw", evecs, ys[b.id]) * f[None, :, :, None]
                new[b.id] = torch.einsum("bkm,sbmw->sbkw", evecs, z)
            out.update(torch.func.vmap(self.compiled.scatter)(new))
        for n in self.uncovered:
            out[n] = v[n].double() * (self.H_diag[n] * s + deltas[-1]) ** p
        return out

    def posterior_precision_dense(self) -> torch.Tensor:
        """P as a dense P x P float64 matrix in `param_names` order (small models only)."""
        return self._dense_power(1.0)

    def posterior_covariance_dense(self) -> torch.Tensor:
        """P^{-1} as a dense matrix (small models only)."""
        return self._dense_power(-1.0)

    def _dense_power(self, p: float) -> torch.Tensor:
        eye = torch.eye(self.n_params, dtype=torch.float64, device=self.mean.device)
        return self.flatten(self.apply_precision_power(self.unflatten(eye), p)).T

    @property
    def posterior_precision(self) -> tuple[Curvature | None, dict[str, torch.Tensor]]:
        """(covered part as a `symo.Curvature` with factors A_lambda + delta_lambda I, {uncovered: diagonal})."""
        self._check_fit()
        deltas, s = self._deltas().detach(), float(self._h_scale().detach())
        curv = None
        if self.compiled is not None:
            dense = {b.id: self.H_factors[b.id] * s + deltas[i] * torch.eye(b.mult, dtype=torch.float64,
                                                                              device=self.mean.device)
                     for i, b in enumerate(self.blocks)}
            curv = Curvature(self.compiled, dense)
        return curv, {n: self.H_diag[n] * s + deltas[-1] for n in self.uncovered}

    def memory(self) -> dict[str, int]:
        """Numbers stored for the posterior (factors, uncovered diagonal) against P and the dense P x P."""
        factors = sum(b.batch * b.mult * b.mult for b in self.blocks)
        diag = sum(math.prod(s) for s in self.uncovered.values())
        return {"posterior_numbers": factors + diag, "factors": factors, "uncovered_diagonal": diag,
                "params": self.n_params, "dense": self.n_params ** 2}

    # ------------------------------------------------------------------ sampling and prediction
    def sample_offsets(self, n_samples: int = 100, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """{name: (n, *shape)}: theta - theta_MAP for n posterior draws, P^{-1/2} z with z ~ N(0, I)."""
        if not isinstance(n_samples, int) or isinstance(n_samples, bool) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive int, got {n_samples!r}")
        z = torch.randn(n_samples, self.n_params, dtype=torch.float64, generator=generator).to(self.mean.device)
        return self.apply_precision_power(self.unflatten(z), -0.5)

    def sample(self, n_samples: int = 100, generator: torch.Generator | None = None) -> torch.Tensor:
        """(n, P) draws from N(theta_MAP, P^{-1}) in `param_names` order, in the model's dtype."""
        return (self.mean.double() + self.flatten(self.sample_offsets(n_samples, generator))).to(self.mean.dtype)

    def functional_variance(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, C): J(x) P^{-1} J(x)^T, from the Jacobians and the blocks' eigendecompositions."""
        self._check_fit()
        jac = jacobians(self.model, self._params, self._frozen, x)
        n, c = x.shape[0], next(iter(jac.values())).shape[1]
        half = self.apply_precision_power({k: t.reshape(n * c, *self.shapes[k]) for k, t in jac.items()}, -0.5)
        flat = self.flatten(half).reshape(n, c, -1)
        return flat @ flat.transpose(-1, -2)

    def predictive(self, x: torch.Tensor, pred_type: str = "glm", link_approx: str = "probit",
                   n_samples: int = 100, generator: torch.Generator | None = None
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Classification: probabilities (N, C). Regression: (mean (N, C), covariance (N, C, C)) for "glm",
        (mean, variance (N, C)) for "nn"; sigma_noise^2 is not included, as in laplace-torch.

        "glm" + "probit": the linearised predictive's variance from Jacobians, probit link. "glm" + "mc":
        draws from the linearised predictive by forward-mode products, no Jacobian formed. "nn" + "mc":
        the network at sampled parameters."""
        check_predictive_options(pred_type, link_approx)
        self._check_fit()
        x = x.to(self.mean.device)
        with torch.no_grad():
            f_mu = torch.func.functional_call(self.model, {**self._frozen, **self._params}, (x,))
        if pred_type == "glm" and (link_approx == "probit" or self.likelihood == "regression"):
            f_var = self.functional_variance(x).to(f_mu.dtype)
            return (f_mu, f_var) if self.likelihood == "regression" else probit(f_mu, f_var)
        deltas = {k: t.to(f_mu.dtype) for k, t in self.sample_offsets(n_samples, generator).items()}
        route = linearized_outputs if pred_type == "glm" else nn_outputs
        with torch.no_grad():
            fs = route(self.model, self._params, self._frozen, x, deltas)
        if self.likelihood == "classification":
            return torch.softmax(fs, dim=-1).mean(0)
        return fs.mean(0), fs.var(0)

    __call__ = predictive

    def __repr__(self) -> str:
        spec = self.compiled.name if self.compiled is not None else None
        return (f"SymoLaplace(spec={spec!r}, likelihood={self.likelihood!r}, params={self.n_params}, "
                f"blocks={len(self.blocks)}, uncovered={list(self.uncovered)}, estimator={self.estimator!r})")


def _float64(value: float | torch.Tensor) -> torch.Tensor:
    """A float64 tensor; Python numbers go straight to float64 (not through the default float32)."""
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64)
    return torch.tensor(value, dtype=torch.float64)


__all__ = ["SymoLaplace"]
