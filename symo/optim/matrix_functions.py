"""The matrix functions the kinds share, per block (the linear algebra is symo.runtime.linalg). Each takes the
block's matrix-function config (symo.optim.matrix_function_configs: Eigh(), NewtonSchulz(...), CoupledNewton(...)),
which the block plan holds (`BlockPlan.backend`), and every call passes keyword arguments.

- `current_statistic_apply`: S^{power} Y when S is this step's statistic alone (the Muon path): the polar
  factor by NewtonSchulz, or the Gram side's eigh.
- `stored_power`: A^{power} of a stored (averaged) statistic, by Eigh or CoupledNewton, retried in float64
  and never silently non-finite.
- `taylor_power`: the taylor estimator's H = S_w^{-1} # S_g, raised to 2 power.
"""

from __future__ import annotations

import math

import torch

from ..runtime.compiled import NonFiniteUpdateError
from ..runtime.linalg import (
    FLOAT64_EIGH_MAX,
    gram_power_apply,
    inv_sqrt_newton_schulz,
    lowrank_power_apply,
    newton_schulz,
    newton_schulz_spectral,
    ns_inverse_root_is_accurate,
    spectral_ns_is_cheaper,
    sym_power,
    taylor_mean,
)
from .matrix_function_configs import CoupledNewton, Eigh, MatrixFunction, NewtonSchulz
from .plan import BlockPlan


def current_statistic_apply(y: torch.Tensor, *, statistic: torch.Tensor, plan: BlockPlan, power: float,
                            damping: float, absolute: bool, stats_dtype: torch.dtype,
                            inverse_root: CoupledNewton | None = None) -> tuple[torch.Tensor, float]:
    """S^{power} Y with S this step's statistic alone (`statistic`: its coordinates, maybe Y itself), as (Z, factor):
    the result is factor * Z (sqrt(d) polar(Y) on the Newton–Schulz path, where the caller folds sqrt(d) into
    its update scale so that Muon's scale is one multiplication, rounded as Muon rounds it). The block's
    matrix function is its plan's (`plan.backend`: Eigh() or NewtonSchulz(...)); a statistic other than Y itself on a
    NewtonSchulz block takes `inverse_root` (CoupledNewton; None: its defaults) for its -1/2 power."""
    ys, c = statistic, plan
    if ys is y:
        scale = None if torch.compiler.is_compiling() else gram_safe_scale(y)
        if scale is not None:  # a Gram of these entries would overflow or underflow: the scaled block's
            y = y / scale      # result, scaled back (S^{power} Y is homogeneous of degree 2 power + 1 in Y)
            damping = damping / scale ** 2 if absolute else damping
        if isinstance(c.backend, NewtonSchulz) and power == -0.5:
            return polar_newton_schulz(y, transposed=c.transposed, method=c.backend), math.sqrt(c.dim)
        z = gram_power_apply(y, power, c.dim, damping, absolute=absolute)
        return (z if scale is None else z * scale ** (2 * power + 1)), 1.0
    # a statistic other than Y (statistic="gradient"): formed and powered in stats_dtype
    ys, y64 = ys.to(stats_dtype), y.to(stats_dtype)
    if ys.shape[-2] <= ys.shape[-1]:
        a = ys @ ys.transpose(-1, -2) / c.dim
        method = (inverse_root or CoupledNewton()) if isinstance(c.backend, NewtonSchulz) else Eigh()
        z = stored_power(a, power=power, method=method, where=c.where, damping=damping, absolute=absolute) @ y64
    else:
        z = lowrank_power_apply(ys / math.sqrt(c.dim), y64, power, damping, absolute=absolute)
    return z.to(y.dtype), 1.0


def gram_safe_scale(y: torch.Tensor) -> torch.Tensor | None:
    """A power of two per batch element that brings Y's largest entry near 1, when its Gram (and the Gram's
    square, in Newton–Schulz) would overflow or underflow in Y's dtype; None otherwise, so that gradients of
    ordinary size take exactly the unscaled path (and Muon's rounding)."""
    info = torch.finfo(y.dtype)
    top = y.abs().amax(dim=(-2, -1), keepdim=True)
    if bool(((top > info.max ** 0.25) | ((top < info.tiny ** 0.25) & (top > 0))).any()):
        return torch.exp2(torch.floor(torch.log2(top.clamp_min(info.tiny))))
    return None


def polar_newton_schulz(y: torch.Tensor, *, transposed: bool, method: NewtonSchulz) -> torch.Tensor:
    """polar(Y) by Muon's iteration (or its spectral evaluation), per batch element."""
    # batch 1 (a whole matrix): plain 2-D GEMMs, faster than bmm and rounding like Muon's
    y2 = y[0] if y.shape[0] == 1 else y
    if transposed:
        # Y = G^T of one square matrix: iterate on G, as Muon does (the same map, rounded alike)
        y2 = y2.transpose(-1, -2)
    if ns_method(y2.shape, y2.device, method) == "spectral":
        z = newton_schulz_spectral(y2, method.steps, method.coeffs)
    else:
        work = y2.to(torch.bfloat16) if method.dtype == "bfloat16" else y2
        z = newton_schulz(work, method.steps, method.coeffs).to(y.dtype)
    return (z.transpose(-1, -2) if transposed else z).reshape(y.shape)


def ns_method(shape: tuple[int, ...] | torch.Size, device: torch.device, method: NewtonSchulz) -> str:
    """iterate or spectral for a Newton-Schulz call on a (..., m, n) block (NewtonSchulz.method)."""
    if method.method != "auto":
        return method.method
    cheap = device.type == "cpu" and method.dtype == "float32" and spectral_ns_is_cheaper(shape)
    return "spectral" if cheap else "iterate"


def stored_power(a: torch.Tensor, *, power: float, method: MatrixFunction, where: str, damping: float,
                 absolute: bool) -> torch.Tensor:
    """A^power of a stored statistic by the block's matrix function (Eigh() or CoupledNewton(...)), never diverging.

    The coupled Newton–Schulz iteration runs only for the -1/2 power and where its damping makes it accurate
    (it cannot form a pseudo-inverse); eigh elsewhere. A non-finite result is retried by a float64 eigh; if
    that too is non-finite, NonFiniteUpdateError names the block and the method."""
    if (isinstance(method, CoupledNewton) and power == -0.5
            and ns_inverse_root_is_accurate(a, method.steps, damping, absolute)):
        out = inv_sqrt_newton_schulz(a, method.steps, damping, absolute=absolute)
    else:
        out = sym_power(a, power, damping, FLOAT64_EIGH_MAX, absolute=absolute)
    if bool(torch.isfinite(out).all()):
        return out
    if bool(torch.isfinite(a).all()):
        out = sym_power(a.to(torch.float64), power, damping, FLOAT64_EIGH_MAX, absolute=absolute).to(a.dtype)
        if bool(torch.isfinite(out).all()):
            return out
    raise NonFiniteUpdateError(
        f"Symo's curvature power for {where} came out NaN/inf (backend {method.label}, statistic dtype {a.dtype}, "
        f"statistic {'finite' if bool(torch.isfinite(a).all()) else 'non-finite'}) although the gradients were "
        "finite; this is the optimizer's numerics, not your gradient: use stats_dtype='float64' and "
        "backend='eigh', or add damping")


def taylor_power(sg: torch.Tensor, sw: torch.Tensor, *, power: float, damping: float, absolute: bool
                 ) -> torch.Tensor:
    """H = S_w^{-1} # S_g (solves H S_w H = S_g), then H^{2 power}; S_w is fully damped first (damping at
    least 1e-8, relative to its largest eigenvalue unless `absolute`)."""
    h = taylor_mean(sg, sw, damping, absolute)
    evals, evecs = torch.linalg.eigh(h.double())
    # H is a square root of S_g-like data: rounding zeros of S_g come out at sqrt(eps) * lambda_max
    lam = evals.amax(-1, keepdim=True).clamp_min(0)
    keep = evals > lam * math.sqrt(h.shape[-1] * torch.finfo(sg.dtype).eps)
    shift = damping if absolute else damping * lam
    f = torch.where(keep, (evals.clamp_min(0) + shift).pow(2 * power), torch.zeros_like(evals))
    return ((evecs * f.unsqueeze(-2)) @ evecs.transpose(-1, -2)).to(sg.dtype)
