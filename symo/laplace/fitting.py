"""The curvature behind `symo.laplace`: per-example vectors, projected onto the commutant blockwise.

Every estimator `SymoLaplace` offers is a sum of outer products of vectors in parameter space, one or
a few per training example n (f_n the model's outputs, J_n their Jacobian in the parameters):

- `"ef"`, the empirical Fisher: the gradient of example n's negative log-likelihood at its label,
  g_n = J_n^T r_n with r_n = softmax(f_n) - onehot(y_n) (classification) or f_n - y_n (regression);
- `"ggn_exact"`, the generalised Gauss-Newton sum_n J_n^T Lambda_n J_n, Lambda_n the Hessian of the
  NLL in the outputs: C vectors J_n^T L_n[:, k] per example, L_n L_n^T = Lambda_n, with
  L = diag(sqrt p) - p sqrt(p)^T for softmax outputs (p the probabilities) and L = I for regression;
- `"ggn_mc"`: the same GGN by Monte Carlo, S vectors J_n^T r(y_s) / sqrt(S) per example with the label
  y_s drawn from the model's own predictive p(y | f_n); E[r r^T] = Lambda_n, so the estimate is
  unbiased, at S/C of the exact cost.

Scaling: laplace-torch's. Curvatures are sums over the data (not means); regression uses the
unit-noise loss 1/2 sum ||f - y||^2, so the GGN is sum J^T J and sigma_noise enters later, as
P = H / (sigma_noise^2 T) + P_0 (`symo.laplace`).

The orbit average is linear, so the projected curvature is the sum of the vectors' orbit averages:
block lambda accumulates sum_v Y_v Y_v^T / d_lambda with Y_v = `compiled.gather(v)` (docs/theory.md
section 3), computed as one matrix product per chunk of vectors. Parameters of the subset that the
spec does not cover get the diagonal of the same (unprojected) sum.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Mapping

import torch
from torch.func import functional_call, vjp, vmap

from ..compiler import Spec, SpecError, load_spec
from ..runtime.compiled import CompiledSpec
from ..runtime.compiled import compile as compile_spec

ESTIMATORS = ("ggn", "ggn_exact", "ggn_mc", "ef")
LIKELIHOODS = ("classification", "regression")
# "ggn" picks the exact GGN up to this many outputs (C vectors per example), Monte Carlo above it.
EXACT_GGN_MAX_OUTPUTS = 4


def resolve_estimator(estimator: str, n_outputs: int) -> str:
    """The concrete estimator: "ggn" becomes "ggn_exact" for <= EXACT_GGN_MAX_OUTPUTS outputs, else "ggn_mc"."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if estimator == "ggn":
        return "ggn_exact" if n_outputs <= EXACT_GGN_MAX_OUTPUTS else "ggn_mc"
    return estimator


def batch_loss(out: torch.Tensor, y: torch.Tensor, likelihood: str) -> torch.Tensor:
    """laplace-torch's loss: summed cross-entropy, or 1/2 the summed squared error (unit noise)."""
    if likelihood == "classification":
        return torch.nn.functional.cross_entropy(out, y, reduction="sum")
    return 0.5 * ((out - y) ** 2).sum()


def output_cotangents(out: torch.Tensor, y: torch.Tensor, likelihood: str, estimator: str, mc_samples: int,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, K, C) output-space vectors r with sum_k J^T r_k r_k^T J the example's curvature term."""
    b, c = out.shape
    if likelihood == "classification":
        p = torch.softmax(out, dim=-1)
        if estimator == "ef":
            return (p - torch.nn.functional.one_hot(y, c).to(p.dtype)).unsqueeze(1)
        if estimator == "ggn_exact":  # columns of L = diag(sqrt p) - p sqrt(p)^T, L L^T = diag(p) - p p^T
            s = p.sqrt()
            root = torch.diag_embed(s) - p.unsqueeze(-1) * s.unsqueeze(-2)
            return root.transpose(-1, -2)
        labels = torch.multinomial(p.detach(), mc_samples, replacement=True, generator=generator)  # (B, S)
        onehot = torch.nn.functional.one_hot(labels, c).to(p.dtype)
        return (p.unsqueeze(1) - onehot) / math.sqrt(mc_samples)
    if estimator == "ef":
        return (out - y).unsqueeze(1)
    if estimator == "ggn_exact":
        return torch.eye(c, dtype=out.dtype, device=out.device).expand(b, c, c)
    noise = torch.randn(b, mc_samples, c, dtype=out.dtype, device=out.device, generator=generator)
    return noise / math.sqrt(mc_samples)


def pseudo_gradients(model: torch.nn.Module, params: dict[str, torch.Tensor], frozen: dict[str, torch.Tensor],
                     x: torch.Tensor, cotangents: torch.Tensor) -> dict[str, torch.Tensor]:
    """{name: (B, K, *shape)}: J_n^T r_nk for every example n of x and vector k (per-example vjps)."""

    def one(xi: torch.Tensor, ci: torch.Tensor) -> dict[str, torch.Tensor]:
        def f(p: dict[str, torch.Tensor]) -> torch.Tensor:
            return functional_call(model, {**frozen, **p}, (xi.unsqueeze(0),)).squeeze(0)

        _, pull = vjp(f, params)
        return vmap(pull)(ci)[0]

    return vmap(one)(x, cotangents)


class CurvatureAccumulator:
    """Running sums: block factors sum Y Y^T / d (float64) and the diagonal for uncovered parameters."""

    def __init__(self, compiled: CompiledSpec | None, uncovered: Mapping[str, tuple[int, ...]],
                 device: torch.device | None = None) -> None:
        self.compiled = compiled
        self.factors: dict[str, torch.Tensor] = {}
        if compiled is not None:
            self.factors = {b.id: torch.zeros(b.batch, b.mult, b.mult, dtype=torch.float64, device=device)
                            for b in compiled.blocks}
        self.diag = {n: torch.zeros(s, dtype=torch.float64, device=device) for n, s in uncovered.items()}

    def add(self, vectors: Mapping[str, torch.Tensor]) -> None:
        """Add the outer products of n vectors given as {name: (n, *shape)}."""
        if self.compiled is not None:
            covered = {n: vectors[n] for n in self.compiled.param_names}
            ys = vmap(self.compiled.gather)(covered)
            for b in self.compiled.blocks:
                y = ys[b.id]  # (n, batch, mult, width)
                z = y.permute(1, 2, 0, 3).reshape(b.batch, b.mult, -1)
                self.factors[b.id] += ((z @ z.transpose(-1, -2)) / max(b.dim, 1)).to(torch.float64)
        for n in self.diag:
            self.diag[n] += (vectors[n].to(torch.float64) ** 2).sum(0)


def optional_rules(spec: Spec) -> Spec:
    """The spec with every rule optional (a "?" key), for compiling it on a subset of the parameters."""
    rules = tuple(r if r.pattern.startswith("?") else dataclasses.replace(r, pattern="?" + r.pattern)
                  for r in spec.params)
    return dataclasses.replace(spec, params=rules)


def eigh_psd(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """eigh of a batch of PSD factors, rounding-level negative eigenvalues set to 0."""
    evals, evecs = torch.linalg.eigh((a + a.transpose(-1, -2)) / 2)
    return evals.clamp_min(0.0), evecs


def resolve_subset(model: torch.nn.Module, named: dict[str, torch.Tensor], subset: str | list[str] | None) -> list[str]:
    """The subset's parameter names in model order: None / "all" (every parameter that requires grad),
    "last_layer" (the parameters of the last module that holds any), or a list of names."""
    if subset is None or subset == "all":
        names = [n for n, p in named.items() if p.requires_grad]
    elif subset == "last_layer":
        last = [m for _, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
        if not last:
            raise ValueError("subset='last_layer': the model has no parameters")
        ids = {id(p) for p in last[-1].parameters(recurse=False)}
        names = [n for n, p in named.items() if id(p) in ids]
    elif isinstance(subset, str):
        raise ValueError(f"subset must be 'all', 'last_layer' or a list of parameter names, got {subset!r}")
    else:
        names = list(subset)
        unknown = [n for n in names if n not in named]
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(named), 3, 0.5)
            raise ValueError(f"subset names parameters the model does not have: {unknown}"
                             + (f"; did you mean {close}?" if close else ""))
        names = [n for n in named if n in set(names)]  # model order
    if not names:
        raise ValueError("the subset holds no parameters")
    return names


def check_arguments(spec: object, likelihood: str, estimator: str, mc_samples: object, sigma_noise: object) -> None:
    """SymoLaplace's arguments, each refused with a message naming it before anything is computed."""
    if spec is None:
        raise TypeError("SymoLaplace(model, spec): spec is None; pass the model's symmetry spec: "
                        "symo.infer_spec(model) infers its true group (the one a posterior wants), or a bundled "
                        "name, a path or a CompiledSpec")
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
    resolve_estimator(estimator, 1)  # validates the name
    if not isinstance(mc_samples, int) or mc_samples < 1:
        raise ValueError(f"mc_samples must be a positive int, got {mc_samples!r}")
    if likelihood != "regression" and float(sigma_noise) != 1.0:
        raise ValueError("sigma_noise != 1 is only defined for likelihood='regression'")


def batch_pair(batch: object) -> tuple[torch.Tensor, torch.Tensor]:
    """A train_loader's batch as (x, y) tensors, or a ValueError saying what a batch must be."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
        shown = type(batch).__name__ + (f" with keys {sorted(batch)[:4]}" if isinstance(batch, dict) else "")
        raise ValueError(f"fit: train_loader must yield (x, y) pairs of tensors, got a {shown}; a DataLoader over a "
                         "TensorDataset(x, y) yields them")
    return batch[0], batch[1]


def model_outputs(model: torch.nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The model's outputs on x at `params` (no graph), with the batch and the parameters named if it fails."""
    dtype = next(iter(params.values())).dtype if params else None
    try:
        with torch.no_grad():
            return torch.func.functional_call(model, params, (x,))
    except RuntimeError as exc:
        raise ValueError(f"the model failed on a batch x of shape {tuple(x.shape)} and dtype {x.dtype} (its "
                         f"parameters are {dtype}): {str(exc).splitlines()[0][:200]}; check the inputs' shape and "
                         "dtype against the model") from None


def check_targets(out: torch.Tensor, y: torch.Tensor, likelihood: str) -> None:
    """Targets that fit the outputs and the likelihood, or a ValueError naming shapes and dtypes."""
    if out.dim() != 2:
        raise ValueError(f"the model's output has shape {tuple(out.shape)}; SymoLaplace needs (batch, outputs)")
    if likelihood == "regression":
        if y.shape != out.shape:
            raise ValueError(f"regression targets have shape {tuple(y.shape)}, the outputs {tuple(out.shape)}; "
                             "reshape y to match (e.g. y.unsqueeze(-1))")
        if not y.is_floating_point():
            raise ValueError(f"regression targets are {y.dtype}; give them as floating point (y.float())")
    elif y.is_floating_point() or y.shape != out.shape[:1]:
        raise ValueError(f"classification targets must be class indices of shape ({out.shape[0]},) and an integer "
                         f"dtype; got shape {tuple(y.shape)} and {y.dtype} (e.g. y.long(), or y.squeeze(-1))")


def compile_for_subset(spec: Spec | str | os.PathLike | CompiledSpec | None, named: dict[str, torch.Tensor],
                       shapes: dict[str, tuple[int, ...]], whole: bool,
                       sizes: dict[str, int] | None) -> CompiledSpec | None:
    """The spec compiled for the subset's shapes (None when it covers none of them).

    For a part of the model the spec is first compiled for the whole model (so its errors name the
    spec's own rules), then with every rule optional for the subset: the group restricted to those
    parameters, whose orbit average is the subset's block of the whole orbit average (the group acts
    on each parameter separately)."""
    if spec is None:
        return None
    if isinstance(spec, CompiledSpec):
        bad = [n for n in spec.param_names if shapes.get(n) != spec.shapes[n]]
        if bad:
            shown = ", ".join(f"{n}: compiled {tuple(spec.shapes[n])}, here "
                              f"{tuple(shapes[n]) if n in shapes else 'not in the parameters given'}" for n in bad[:3])
            raise ValueError(f"the compiled spec does not fit these parameters ({shown}"
                             f"{f', and {len(bad) - 3} more' if len(bad) > 3 else ''}); compile it for this model "
                             "(and subset), or pass the spec itself and let SymoLaplace compile it")
        return spec
    if isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    if not isinstance(spec, Spec):
        raise TypeError("spec must be a Spec, a path, a bundled spec name or a CompiledSpec, "
                        f"got {type(spec).__name__}")
    if whole and set(shapes) == set(named):
        compiled = compile_spec(spec, shapes, sizes=sizes)
    else:  # check the spec against the whole model, then restrict every rule to the subset
        compile_spec(spec, {n: tuple(p.shape) for n, p in named.items()}, sizes=sizes)
        try:  # sizes may name spaces the subset does not use; its own shapes usually fix the rest
            compiled = compile_spec(optional_rules(spec), shapes)
        except SpecError:
            compiled = compile_spec(optional_rules(spec), shapes, sizes=sizes)
    return compiled if compiled.param_names else None


def check_tiling(compiled: CompiledSpec | None) -> None:
    """The blocks' coordinates must split the covered parameters exactly (sum of batch mult d = their count)."""
    if compiled is None:
        return
    total = sum(math.prod(s) for s in compiled.shapes.values())
    tiled = sum(b.batch * b.mult * b.dim for b in compiled.blocks)
    if total != tiled:
        raise ValueError(f"spec {compiled.name!r}: its blocks span {tiled} dimensions, its parameters {total}; "
                         "SymoLaplace needs blocks that split the parameters exactly")


__all__ = ["ESTIMATORS", "EXACT_GGN_MAX_OUTPUTS", "LIKELIHOODS", "CurvatureAccumulator", "batch_loss",
           "check_tiling", "compile_for_subset", "eigh_psd", "optional_rules", "output_cotangents",
           "pseudo_gradients", "resolve_estimator", "resolve_subset"]
