"""Does an optimizer respect a symmetry of the loss? Train twins w and A w in lockstep and compare.

If L(A w) = L(w) for a group element A, gradient flow from A w is A times gradient flow from w. An
update rule is *equivariant* when the same holds step by step: A w_t = w'_t, where w'_t is trained
from A w_0. Rules built from the group's commutant (SGD, heavy ball, shared-scalar Adam, Muon,
Shampoo, Symo for the O(k) gauge of W = U V^T) pass to float precision; coordinate-wise rules (Adam,
RMSProp, Lion, signSGD, Adafactor) fail at the first step ("The Loss Does Not See the Basis, but Adam
Does"; docs/theory.md §5).

    report = symo.check_equivariance(lambda ps: torch.optim.Adam(ps, lr=1e-2))   # factored problem
    print(report.summary())          # verdict, step-1 defect, divergence after k steps

Everything runs in float64, so "equivariant" means a divergence at rounding level.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..compiler import Spec
from ..runtime.compiled import CompiledSpec, compile_for
from .problems import factored_problem

OptimizerFactory = Callable[[list[tuple[str, torch.Tensor]]], torch.optim.Optimizer]


@dataclass(frozen=True)
class EquivarianceReport:
    """`divergence[t]` = ||A w_t - w'_t|| / ||w'_t|| over all parameters after t steps (t = 0 .. steps).

    `symmetry_defect` = |L(A w_0) - L(w_0)| / |L(w_0)|: the group element must leave the loss
    invariant for the twin test to mean anything (see `symo.check_symmetry`)."""

    divergence: list[float]
    symmetry_defect: float
    tolerance: float

    @property
    def steps(self) -> int:
        return len(self.divergence) - 1

    @property
    def first_step_defect(self) -> float:
        return self.divergence[1] if len(self.divergence) > 1 else 0.0

    @property
    def final_divergence(self) -> float:
        return self.divergence[-1]

    @property
    def is_symmetry(self) -> bool:
        return self.symmetry_defect <= self.tolerance

    @property
    def is_equivariant(self) -> bool:
        return self.is_symmetry and all(math.isfinite(d) and d <= self.tolerance for d in self.divergence)

    def summary(self) -> str:
        if not self.is_symmetry:
            return (f"NOT A SYMMETRY: the group element changes the loss by {self.symmetry_defect:.2e} (relative), "
                    "so twins are not expected to agree; check the spec against the model")
        verdict = "EQUIVARIANT to float precision" if self.is_equivariant else "NOT equivariant"
        return (f"{verdict}: divergence ||A w_t - w'_t|| / ||w'_t|| = {self.first_step_defect:.2e} at step 1, "
                f"{self.final_divergence:.2e} after {self.steps} steps (tolerance {self.tolerance:.0e})")


class _Twin:
    """One copy of the parameters (a module deep-copied to float64, or a dict of float64 leaves)."""

    def __init__(self, model: nn.Module | Mapping[str, torch.Tensor], loss_fn: Callable[[Any], torch.Tensor]):
        if isinstance(model, nn.Module):
            self.module = copy.deepcopy(model).double()
            self.params = dict(self.module.named_parameters())
            self._arg: Any = self.module
        else:
            self.params = {n: t.detach().to(torch.float64).clone().requires_grad_(True) for n, t in model.items()}
            self._arg = self.params
        self.loss_fn = loss_fn

    def loss(self) -> torch.Tensor:
        return self.loss_fn(self._arg)

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.params.items()}


def _flat(tensors: Mapping[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([tensors[n].reshape(-1) for n in names])


def check_equivariance(make_optimizer: OptimizerFactory, model: nn.Module | Mapping[str, torch.Tensor] | None = None,
                       spec: str | Path | Spec | CompiledSpec | None = None,
                       loss_fn: Callable[[Any], torch.Tensor] | None = None, *, steps: int = 10, seed: int = 0,
                       tolerance: float = 1e-8, sizes: dict[str, int] | None = None) -> EquivarianceReport:
    """Train w and A w in lockstep with two optimizers from `make_optimizer` and measure how far A w_t
    drifts from w'_t (float64).

    Args:
        make_optimizer: named parameters [(name, tensor), ...] -> any `torch.optim.Optimizer`, e.g.
            `lambda ps: torch.optim.Adam(ps, lr=1e-2)` or `lambda ps: symo.Symo(ps, "factored")`.
        model: an `nn.Module` (then `loss_fn(module)`), a dict {name: tensor} (then `loss_fn(dict)`), or
            None for `factored_problem()` (a small W = U V^T matrix-sensing problem; spec "factored").
        spec: the symmetry (a bundled spec name, a path, a Spec or a CompiledSpec); A is drawn from it.
        loss_fn: a deterministic loss; L(A w) must equal L(w) (reported as `symmetry_defect`).
        steps: lockstep steps k; divergence is recorded after every step.
        tolerance: relative divergence below which the rule is called equivariant.
    """
    if model is None:
        if loss_fn is not None:
            raise ValueError("loss_fn given without a model: pass model= too (or neither, for the factored problem)")
        model, loss_fn = factored_problem(seed=seed)
        spec = "factored" if spec is None else spec
    if loss_fn is None or spec is None:
        raise ValueError("check_equivariance needs spec= and loss_fn= with a model "
                         "(loss_fn(module) for an nn.Module, loss_fn({name: tensor}) for a dict)")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a number >= 0, got {tolerance}")
    base, twin = _Twin(model, loss_fn), _Twin(model, loss_fn)
    shapes = {n: tuple(p.shape) for n, p in base.params.items()}
    compiled = compile_for(spec, shapes, sizes)
    gen = torch.Generator().manual_seed(seed + 1)
    element = compiled.random_element(gen, dtype=torch.float64)
    with torch.no_grad():
        moved = compiled.act(element, base.snapshot())
        for n, p in twin.params.items():
            p.copy_(moved[n])
        try:
            loss0, loss1 = float(base.loss()), float(twin.loss())
        except RuntimeError as exc:
            if "dtype" not in str(exc) and "Double" not in str(exc):
                raise
            raise TypeError(f"loss_fn failed on the float64 copy of the model ({str(exc)[:200]}): the twins are "
                            "float64, so data the loss closes over must be float64 too, e.g. "
                            "lambda m: loss(m(x.double()), y.double())") from None
    symmetry_defect = abs(loss1 - loss0) / max(abs(loss0), 1e-300)

    names = list(base.params)
    opts = [make_optimizer(list(t.params.items())) for t in (base, twin)]
    if not all(isinstance(o, torch.optim.Optimizer) for o in opts):
        raise TypeError("make_optimizer must return a torch.optim.Optimizer")
    divergence = [_divergence(compiled, element, base, twin, names)]
    for _ in range(steps):
        for t, opt in zip((base, twin), opts):
            opt.zero_grad(set_to_none=True)
            t.loss().backward()
            opt.step()
        divergence.append(_divergence(compiled, element, base, twin, names))
    return EquivarianceReport(divergence=divergence, symmetry_defect=symmetry_defect, tolerance=tolerance)


def _divergence(compiled: CompiledSpec, element, base: _Twin, twin: _Twin, names: list[str]) -> float:
    with torch.no_grad():
        a_w = _flat(compiled.act(element, base.snapshot()), names)
        w2 = _flat(twin.snapshot(), names)
        return float((a_w - w2).norm() / w2.norm().clamp_min(1e-300))


__all__ = ["EquivarianceReport", "OptimizerFactory", "check_equivariance"]
