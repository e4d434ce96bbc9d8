"""Table-driven numerics of the stored-statistics path: no backend diverges, nothing is lost silently.

Each case designs a gradient G = U diag(sigma) V^T for one square weight under specs/muon.toml (one block,
coordinates Y = G^T, statistic S = G^T G / rows) and takes one step with beta2 > 0 (the bias-corrected
EMA after one step is S itself) from zero weights at lr 1, so the new weights are exactly minus the
update, rounded once to the parameter's dtype. The reference is a dense float64 eigh of S formed from the
same (rounded) gradient:

- eigh: f(lambda) = (lambda + damping lambda_max)^{-1/2} on eigenvalues above 8 sqrt(n) eps64 lambda_max,
  0 below (the pseudo-inverse rule of docs/theory.md, in the float64 the statistics are kept in);
- the coupled Newton-Schulz iteration, where it runs: (S + damping ||S||_F I)^{-1/2}.

Spectra: condition number 1e12 (sigma over 6 decades), and rank deficiency (exact zero eigenvalues, which
rounding turns into tiny positive and negative ones). Tolerances, stated: 1e-3 relative for float32 and
float64-rounded inputs (an eigenvalue at 1e-12 lambda_max is known to ~1e-4 of itself in float64),
1e-2 for bfloat16 (the result is rounded once to 8 bits). Undamped, every direction that G holds must
survive: the update G S^{+1/2} is sqrt(rows) U_r V_r^T, so its r singular values all equal sqrt(rows)
(r counts the rounded gradient's directions: rounding to bfloat16 fills the null space with noise at
~4e-3 of sigma_max, which is data the optimizer must treat as such).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from symo import NonFiniteUpdateError, Symo
from symo.runtime.linalg import ns_inverse_root_min_damping

MUON = Path(__file__).resolve().parent.parent / "specs" / "muon.toml"
SIZES = (4, 140, 260)                 # below and above the auto rule's eigh_max_size (128)
DTYPES = (torch.float32, torch.bfloat16)
BACKENDS = ("eigh", "newton_schulz", "auto")
DAMPINGS = (0.0, 1e-6, 1e-3)
SPECTRA = ("cond1e12", "rank_deficient")
TOL = {torch.float32: 1e-3, torch.bfloat16: 1e-2}


def designed_gradient(n: int, spectrum: str, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, int]:
    gen = torch.Generator().manual_seed(seed + n)
    u, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    if spectrum == "cond1e12":
        sigma, rank = torch.logspace(0, -6, n, dtype=torch.float64), n
    else:
        rank = max(1, n // 3)
        sigma = torch.cat([torch.logspace(0, -2, rank, dtype=torch.float64),
                           torch.zeros(n - rank, dtype=torch.float64)])
    g = (u[:, :rank] * sigma[:rank]) @ v[:, :rank].T
    return g.to(dtype), rank


def reference_update(g: torch.Tensor, damping: float, newton_schulz: bool) -> torch.Tensor:
    g = g.double()
    s = g.T @ g / g.shape[0]
    evals, evecs = torch.linalg.eigh(s)
    if newton_schulz:
        f = (evals + damping * torch.linalg.matrix_norm(s)).clamp_min(1e-300).pow(-0.5)
    else:
        lam = evals.max()
        keep = evals > 8 * math.sqrt(len(s)) * torch.finfo(torch.float64).eps * lam
        f = torch.where(keep, (evals + damping * lam).clamp_min(1e-300).pow(-0.5), torch.zeros_like(evals))
    return g @ ((evecs * f) @ evecs.T)


def one_step(g: torch.Tensor, **options) -> tuple[torch.Tensor, Symo]:
    n = g.shape[0]
    layer = nn.Linear(n, n, bias=False).to(g.dtype)
    with torch.no_grad():
        layer.weight.zero_()
    opt = Symo({"fc1.weight": layer.weight}, MUON, preconditioner="root", lr=1.0, beta1=0.0, beta2=0.9,
               statistic="gradient", **options)
    layer.weight.grad = g.clone()
    opt.step()
    return -layer.weight.detach().double(), opt


# plus blocks above linalg.FLOAT64_EIGH_MAX (512), where float32 data would be decomposed in float32
CASES = list(itertools.product(SIZES, DTYPES, BACKENDS, DAMPINGS, SPECTRA)) + [
    (520, torch.float32, "auto", 0.0, "cond1e12"), (520, torch.bfloat16, "eigh", 0.0, "rank_deficient")]


@pytest.mark.parametrize("n,dtype,backend,damping,spectrum", CASES,
                         ids=[f"{n}-{str(d)[6:]}-{b}-{dm:g}-{s}" for n, d, b, dm, s in CASES])
def test_every_backend_is_finite_and_close_to_the_float64_eigh_reference(n, dtype, backend, damping, spectrum):
    g, rank = designed_gradient(n, spectrum, dtype)
    got, opt = one_step(g, backend=backend, damping=damping)
    assert torch.isfinite(got).all()
    # the coupled iteration runs only where its damping makes it accurate (float64 statistics)
    ran_ns = backend == "newton_schulz" and damping >= ns_inverse_root_min_damping(25, torch.float64)
    want = reference_update(g, damping, ran_ns)
    err = float((got - want).norm() / want.norm())
    assert err < TOL[dtype], err
    if damping == 0.0:  # nothing lost: every direction the (rounded) gradient holds gets singular value sqrt(rows)
        sigma = torch.linalg.svdvals(g.double())
        held = int((sigma ** 2 > 1e-13 * sigma[0] ** 2).sum())     # well above the 8 sqrt(n) eps64 threshold
        assert held >= rank
        sv = torch.linalg.svdvals(got)
        assert float(sv[held - 1]) > 0.9 * math.sqrt(n) and float(sv[0]) < 1.1 * math.sqrt(n), (sv[0], sv[held - 1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_float32_statistics_stay_finite_and_drop_only_what_float32_cannot_hold(dtype):
    """stats_dtype="float32": the statistic holds its eigenvalues only to ~1e-7 lambda_max, so directions
    below that are dropped (pseudo-inverse, not noise amplified); the result is finite, and the directions
    with sigma^2 > 1e-5 sigma_max^2 (eigenvalues well above float32 rounding) all survive."""
    n = 140
    g, _ = designed_gradient(n, "cond1e12", dtype)
    got, _ = one_step(g, backend="eigh", damping=0.0, stats_dtype="float32")
    assert torch.isfinite(got).all()
    sv = torch.linalg.svdvals(got)
    sigma = torch.linalg.svdvals(g.double())
    held = int((sigma ** 2 > 1e-5 * sigma[0] ** 2).sum())
    assert float(sv[held - 1]) > 0.5 * math.sqrt(n)
    assert float(sv.max()) < 1.1 * math.sqrt(n)


def test_tiny_negative_eigenvalues_map_to_zero_not_nan():
    """A statistic with eigenvalues -1e-17 lambda_max (what rounding makes of exact zeros), given to the
    matrix function directly: the -1/2 power is finite and zero on those directions, for each backend."""
    from symo.optim import CoupledNewton, Eigh
    from symo.optim.matrix_functions import stored_power

    gen = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=gen, dtype=torch.float64))
    evals = torch.tensor([1.0, 0.5, 0.1, 1e-3, 0.0, -1e-17, -3e-17, 0.0], dtype=torch.float64)
    a = (q * evals) @ q.T
    for backend in (Eigh(), CoupledNewton()):
        out = stored_power(a, power=-0.5, method=backend, where="test block", damping=0.0, absolute=False)
        assert torch.isfinite(out).all()
        got = torch.linalg.eigvalsh(q.T @ out @ q)
        want = torch.tensor([1.0, 0.5 ** -0.5, 0.1 ** -0.5, 1e-3 ** -0.5, 0, 0, 0, 0], dtype=torch.float64)
        assert torch.allclose(got.sort().values, want.sort().values, atol=1e-9, rtol=1e-9), backend


def test_a_non_finite_curvature_power_retries_in_float64_then_names_the_block(monkeypatch):
    """The optimizer's own NaN gets its own error (naming block and backend), never the gradient message;
    a failure of the first evaluation only is repaired by the float64 retry."""
    import symo.optim.matrix_functions as optim  # where the step evaluates its matrix powers

    g, _ = designed_gradient(6, "cond1e12", torch.float32)
    real = optim.sym_power
    calls = []

    def flaky(a, *args, **kwargs):
        calls.append(a.dtype)
        out = real(a, *args, **kwargs)
        return out * float("nan") if len(calls) == 1 else out

    monkeypatch.setattr(optim, "sym_power", flaky)
    got, _ = one_step(g, backend="eigh", damping=0.0, stats_dtype="float32")
    assert calls == [torch.float32, torch.float64] and torch.isfinite(got).all()

    monkeypatch.setattr(optim, "sym_power", lambda a, *args, **kwargs: real(a, *args, **kwargs) * float("nan"))
    with pytest.raises(NonFiniteUpdateError, match=r"block L0 .*backend eigh.*not your gradient") as err:
        one_step(g, backend="eigh", damping=0.0)
    assert "lower the learning rate" not in str(err.value)
