"""`symo.runtime.linalg` against dense float64 references written here from their definitions.

Every function is run on a batch of blocks of very different scales (one rank-deficient), because the
conventions are per block: a relative damping against a batch-wide lambda_max, or one norm for the whole
batch, must fail by a wide margin. Matrix functions: f(A) = V f(L) V^T by a float64 eigh per block.
"""

from __future__ import annotations

import math

import pytest
import torch
from cases import blocks
from helpers import ref_power, rel

from symo.runtime import linalg
from symo.runtime.linalg import (
    MUON_COEFFS,
    geometric_mean,
    gram_power_apply,
    inv_sqrt_newton_schulz,
    lowrank_power_apply,
    newton_schulz,
    root_power,
    spectral_fn,
    sym_power,
)

F64 = torch.float64
EPS64 = torch.finfo(F64).eps


def global_lambda_reference(a: torch.Tensor, p: float, damping: float) -> torch.Tensor:
    """The wrong convention: one lambda_max for the whole batch."""
    lam = float(torch.linalg.eigvalsh(a).max())
    return torch.stack([ref_power(x, p, damping * lam / float(torch.linalg.eigvalsh(x).max())) for x in a])


# ------------------------------------------------------------------------------------------ eigh functions
@pytest.mark.parametrize("p", [-0.5, -0.25, -1.0, 0.5, 1.5])
@pytest.mark.parametrize("damping,absolute", [(0.0, False), (1e-2, False), (1e-2, True), (0.0, True)])
def test_sym_power_per_block(p, damping, absolute):
    a = blocks()
    got = sym_power(a, p, damping, absolute=absolute)
    assert got.dtype == F64
    for k in range(len(a)):
        assert rel(got[k], ref_power(a[k], p, damping, absolute)) < 1e-10, k
    if damping > 0 and not absolute and p < 0:
        assert rel(got, global_lambda_reference(a, p, damping)) > 1e-1


def test_sym_power_pseudo_inverse_on_a_rank_deficient_block():
    """A^{-1/2} A A^{-1/2} is the projector onto the support (rank 3 of 6), not the identity."""
    a = blocks(ranks=(3,), scales=(1.0,))[0]
    s = sym_power(a, -0.5)
    u, sv, _ = torch.linalg.svd(a)
    proj = u[:, :3] @ u[:, :3].T
    assert float(sv[3] / sv[0]) < 1e-14
    assert rel(s @ a @ s, proj) < 1e-10


def test_sym_power_float32_input_comes_back_float32():
    a = blocks().float()
    got = sym_power(a, -0.5, 1e-3)
    assert got.dtype == torch.float32
    want = ref_power(a.double(), -0.5, 1e-3, zero_rel=8 * math.sqrt(6) * torch.finfo(torch.float32).eps)
    assert rel(got.double(), want) < 1e-5


def test_spectral_fn_threshold_and_damping_rules():
    """Zero tolerance 8 sqrt(size) eps lambda_max, strictly below kept; relative shift damping * lambda_max;
    absolute shift damping; zeros map to zero under both."""
    size, eps = 4, EPS64
    tol = 8 * math.sqrt(size) * eps
    evals = torch.tensor([[4.0, 4.0 * 1.5 * tol, 4.0 * tol, -1e-3]], dtype=F64)
    got = spectral_fn(evals, -1.0, 0.0, size, F64)
    assert got.tolist() == [[0.25, 1 / (6 * tol), 0.0, 0.0]]
    got = spectral_fn(evals, -0.5, 0.1, size, F64)
    assert torch.allclose(got, torch.tensor([[(4.4) ** -0.5, (4 * 1.5 * tol + 0.4) ** -0.5, 0.0, 0.0]], dtype=F64),
                          rtol=1e-14, atol=0)
    got = spectral_fn(evals, -0.5, 0.1, size, F64, absolute=True)
    assert torch.allclose(got, torch.tensor([[4.1 ** -0.5, (4 * 1.5 * tol + 0.1) ** -0.5, 0.0, 0.0]], dtype=F64),
                          rtol=1e-14, atol=0)
    # the tolerance uses the dtype's eps and the size
    f32 = torch.tensor([[1.0, 1e-5]], dtype=F64)
    assert spectral_fn(f32, -1.0, 0.0, 2, torch.float32)[0, 1] == pytest.approx(1e5)  # 1e-5 > 8 sqrt(2) eps32
    assert spectral_fn(f32, -1.0, 0.0, 10 ** 6, torch.float32)[0, 1] == 0.0           # 1e-5 < 8e3 eps32
    # lambda_max is per row (block); an all-negative block has no support
    two = torch.tensor([[1.0, 1e-3], [1e3, 1e-3], [-1.0, -2.0]], dtype=F64)
    got = spectral_fn(two, 1.0, 0.5, 2, F64)
    assert got.tolist() == [[1.5, 1e-3 + 0.5], [1e3 + 500, 1e-3 + 500], [0.0, 0.0]]


def test_root_power_is_a_root_of_the_power():
    """F (m x r), r < m: F' F'^T = (F F^T)^p, per block, pseudo-inverse and relative damping."""
    gen = torch.Generator().manual_seed(1)
    f = torch.randn(3, 7, 3, generator=gen, dtype=F64) * torch.tensor([1.0, 1e2, 1e-2], dtype=F64).view(3, 1, 1)
    for p, damping in ((-0.5, 0.0), (-0.5, 0.1), (-1.0, 1e-3), (0.5, 0.0)):
        r = root_power(f, p, damping)
        assert r.shape == f.shape
        want = ref_power(f @ f.transpose(-1, -2), p, damping)
        assert rel(r @ r.transpose(-1, -2), want) < 1e-10, (p, damping)


def test_root_power_float32_undamped_keeps_what_float32_data_resolves():
    """An undamped float32 root: the Gram is formed in float64 and eigenvalues at or below
    8 max(m, r) eps32^2 lambda_max are zeros. A singular value at 3e-4 relative is real data (kept: the
    old float32-Gram rule, 8 sqrt(m) eps32 on eigenvalues, dropped it), one at 1e-9 is rounding (zero)."""
    zero_rel = 8 * 7 * torch.finfo(torch.float32).eps ** 2
    u, _ = torch.linalg.qr(torch.randn(7, 2, dtype=F64))
    for small, rank in [(3e-4, 2), (1e-9, 1)]:
        f = (u * torch.tensor([1.0, small], dtype=F64)).float()
        r = root_power(f, -0.5).double()
        want = ref_power(f.double() @ f.double().T, -0.5, zero_rel=zero_rel)
        assert rel(r @ r.T, want) < 1e-5, small
        assert torch.linalg.matrix_rank(r @ r.T, rtol=1e-12) == rank, small


@pytest.mark.parametrize("shape", [(3, 4, 9), (3, 9, 4)])
@pytest.mark.parametrize("p,damping,absolute", [(-0.5, 0.0, False), (-0.5, 0.1, False), (-0.25, 1e-2, True),
                                                (-1.0, 1e-3, False)])
def test_gram_power_apply_either_side(shape, p, damping, absolute):
    """(Y Y^T / d)^p Y through whichever Gram is smaller, per block."""
    gen = torch.Generator().manual_seed(2)
    y = torch.randn(*shape, generator=gen, dtype=F64) * torch.tensor([1.0, 1e2, 1e-2], dtype=F64).view(3, 1, 1)
    d = 5
    got = gram_power_apply(y, p, d, damping, absolute=absolute)
    want = ref_power(y @ y.transpose(-1, -2) / d, p, damping, absolute) @ y
    assert rel(got, want) < 1e-10


@pytest.mark.parametrize("p,damping,absolute", [(-0.5, 0.0, False), (-0.5, 0.1, False), (-0.5, 1e-2, True),
                                                (-1.0, 1e-3, True), (-0.25, 0.0, True)])
def test_lowrank_power_apply_on_vectors_outside_the_range(p, damping, absolute):
    """(F F^T)^p Y with F (m x r), r < m, and Y not in range(F): the orthogonal complement maps to 0 under both
    damping conventions."""
    gen = torch.Generator().manual_seed(3)
    f = torch.randn(2, 8, 3, generator=gen, dtype=F64) * torch.tensor([1.0, 1e2], dtype=F64).view(2, 1, 1)
    y = torch.randn(2, 8, 5, generator=gen, dtype=F64)
    got = lowrank_power_apply(f, y, p, damping, absolute=absolute)
    want = ref_power(f @ f.transpose(-1, -2), p, damping, absolute) @ y
    # the reference's own limit: its rounding zeros (1e-12 at scale 1e4) sit on an absolute damping of 1e-3
    assert rel(got, want) < 1e-8


# ------------------------------------------------------------------------------------------ iterations
def quintic_reference(g: torch.Tensor, steps: int, coeffs, eps: float = 1e-7) -> torch.Tensor:
    """Newton–Schulz acts on singular values only: U p^steps(S / (||G||_F + eps)) V^T, p(x) = a x + b x^3 + c x^5."""
    a, b, c = coeffs
    u, s, vh = torch.linalg.svd(g.to(F64), full_matrices=False)
    x = s / (float(torch.linalg.norm(g.to(F64))) + eps)
    for _ in range(steps):
        x = a * x + b * x ** 3 + c * x ** 5
    return (u * x) @ vh


@pytest.mark.parametrize("shape", [(4, 9), (9, 4)])
@pytest.mark.parametrize("steps,coeffs", [(5, MUON_COEFFS), (2, (2.0, -1.5, 0.5)), (30, (1.5, -0.5, 0.0))])
def test_newton_schulz_acts_on_singular_values(shape, steps, coeffs):
    """Batch of three blocks, one so small that eps matters, each normalised by its own norm."""
    gen = torch.Generator().manual_seed(4)
    g = torch.randn(3, *shape, generator=gen, dtype=F64)
    g = g * torch.tensor([1.0, 1e3, 1e-8], dtype=F64).view(3, 1, 1)
    got = newton_schulz(g, steps, coeffs)
    for k in range(3):
        assert rel(got[k], quintic_reference(g[k], steps, coeffs)) < 1e-11, k
    if steps == 30:  # the cubic converges to the polar factor U V^T (the tiny block is far from converged)
        u, _, vh = torch.linalg.svd(g[0], full_matrices=False)
        assert rel(got[0], u @ vh) < 1e-12


def test_newton_schulz_defaults_are_muons():
    g = torch.randn(5, 7, dtype=F64)
    assert rel(newton_schulz(g), quintic_reference(g, 5, (3.4445, -4.7750, 2.0315), 1e-7)) < 1e-12
    tiny = 1e-7 * torch.randn(5, 7, dtype=F64)
    assert rel(newton_schulz(tiny), quintic_reference(tiny, 5, MUON_COEFFS, 1e-7)) < 1e-12
    assert rel(newton_schulz(tiny, eps=1e-12), quintic_reference(tiny, 5, MUON_COEFFS, 1e-12)) < 1e-12


def test_reference_muon_quintic_lands_where_its_docstring_says():
    """tests/references.py's quintic equals the singular-value polynomial, and its singular values for a
    generic matrix land in Muon's documented band (about 0.68 to 1.13), not at 1."""
    from references import newton_schulz as reference_ns

    gen = torch.Generator().manual_seed(5)
    for shape in ((16, 40), (40, 16)):
        g = torch.randn(*shape, generator=gen, dtype=F64)
        got = reference_ns(g, dtype=F64)
        assert rel(got, quintic_reference(g, 5, MUON_COEFFS)) < 1e-12
        s = torch.linalg.svdvals(got)
        assert 0.6 < float(s.min()) and float(s.max()) < 1.2 and float(s.max() - s.min()) > 0.1


@pytest.mark.parametrize("absolute", [False, True])
def test_inverse_root_newton_schulz_frobenius_convention(absolute):
    """(A + delta I)^{-1/2} with delta = damping ||A||_F per block (relative; not lambda_max) or damping."""
    a = blocks(ranks=(6, 2, 6), scales=(1.0, 10.0, 0.1))
    damping = 0.05
    got = inv_sqrt_newton_schulz(a, 60, damping, absolute=absolute)
    for k in range(len(a)):
        frob = float(torch.sqrt((a[k] ** 2).sum()))
        delta = damping if absolute else damping * frob
        want = ref_power(a[k] + delta * torch.eye(6, dtype=F64), -0.5)
        assert rel(got[k], want) < 1e-10, k
        if not absolute:
            assert rel(got[k], ref_power(a[k], -0.5, damping)) > 1e-2, k   # lambda_max convention
    few = inv_sqrt_newton_schulz(a, 3, damping, absolute=absolute)
    assert rel(few, got) > 1e-2   # `steps` is honoured: 3 steps are far from converged


def test_inverse_root_newton_schulz_default_steps():
    a = blocks(ranks=(6,), scales=(1.0,))
    delta = 0.1 * float(torch.sqrt((a ** 2).sum()))
    want = ref_power(a[0] + delta * torch.eye(6, dtype=F64), -0.5)
    assert rel(inv_sqrt_newton_schulz(a, damping=0.1)[0], want) < 1e-10                 # 25 steps suffice here
    assert torch.equal(inv_sqrt_newton_schulz(a, damping=0.1), inv_sqrt_newton_schulz(a, 25, damping=0.1))
    assert not torch.equal(inv_sqrt_newton_schulz(a, damping=0.1), inv_sqrt_newton_schulz(a, 26, damping=0.1))


def test_geometric_mean_against_its_formula_and_riccati():
    """A # B = A^{1/2} (A^{-1/2} B A^{-1/2})^{1/2} A^{1/2}, the positive solution of X A^{-1} X = B, per block;
    for commuting (diagonal) A, B it is sqrt(A B)."""
    a = blocks(ranks=(6, 6, 6), scales=(1.0, 1e2, 1e-2), seed=6) + 1e-3 * torch.eye(6, dtype=F64)
    b = blocks(ranks=(6, 2, 6), scales=(1e-1, 1.0, 10.0), seed=7)
    x = geometric_mean(a, b)
    for k in range(len(a)):
        half, ihalf = ref_power(a[k], 0.5), ref_power(a[k], -0.5)
        want = half @ ref_power(ihalf @ b[k] @ ihalf, 0.5) @ half
        assert rel(x[k], want) < 1e-9, k
        assert rel(x[k] @ torch.linalg.inv(a[k]) @ x[k], b[k]) < 1e-8, k
    da, db = torch.tensor([1.0, 4.0, 9.0], dtype=F64), torch.tensor([4.0, 1.0, 0.25], dtype=F64)
    assert rel(geometric_mean(torch.diag(da), torch.diag(db)), torch.diag((da * db).sqrt())) < 1e-14


def test_eigh_precision_rules(monkeypatch):
    """float64 up to float64_max, the input's dtype above it (float64 input never lowered), and a float64
    retry when the float32 solver fails."""
    a32 = blocks(m=4).float()
    assert linalg._eigh(a32, 4)[0].dtype == F64
    assert linalg._eigh(a32, 3)[0].dtype == torch.float32
    assert linalg._eigh(a32.double(), 3)[0].dtype == F64
    assert linalg.FLOAT64_EIGH_MAX == 512
    assert sym_power(a32, -0.5, 1e-3, float64_max=3).dtype == torch.float32
    real = torch.linalg.eigh

    def flaky(x):
        if x.dtype == torch.float32:
            raise torch.linalg.LinAlgError("did not converge")
        return real(x)

    monkeypatch.setattr(torch.linalg, "eigh", flaky)
    evals, _ = linalg._eigh(a32, 3)
    assert evals.dtype == F64
    assert rel(evals, real(a32.double())[0]) < 1e-12


def test_float64_max_is_honoured_by_every_eigh_user():
    """float32 blocks: with float64_max=0 every function decomposes in float32 (a different rounding from the
    default float64 path, still accurate to float32), so each one passes its argument on."""
    gen = torch.Generator().manual_seed(8)
    f = torch.randn(2, 7, 3, generator=gen)
    y = torch.randn(2, 7, 5, generator=gen)
    a = (f @ f.transpose(-1, -2) + 0.1 * torch.eye(7)).float()
    calls = {
        "sym_power": lambda m: sym_power(a, -0.5, 1e-3, float64_max=m),
        "root_power": lambda m: root_power(f, -0.5, 1e-3, float64_max=m),
        "gram_power_apply": lambda m: gram_power_apply(y, -0.5, 3, 1e-3, float64_max=m),
        "gram_power_apply_tall": lambda m: gram_power_apply(y.transpose(-1, -2), -0.5, 3, 1e-3, float64_max=m),
        "lowrank_power_apply": lambda m: lowrank_power_apply(f, y, -0.5, 1e-3, float64_max=m),
        "geometric_mean": lambda m: geometric_mean(a, a @ a, float64_max=m),
    }
    for name, fn in calls.items():
        exact, low = fn(512), fn(0)
        assert exact.dtype == low.dtype == torch.float32, name
        assert not torch.equal(exact, low), name
        assert rel(low.double(), exact.double()) < 1e-4, name


def test_inverse_root_newton_schulz_defaults_to_no_damping():
    """A well-conditioned block (eigenvalues in [1, 2]): the default call gives A^{-1/2} itself."""
    q, _ = torch.linalg.qr(torch.randn(5, 5, generator=torch.Generator().manual_seed(9), dtype=F64))
    a = (q * torch.linspace(1.0, 2.0, 5, dtype=F64)) @ q.T
    assert rel(inv_sqrt_newton_schulz(a.unsqueeze(0))[0], ref_power(a, -0.5)) < 1e-12


def test_lowrank_zero_tolerance_uses_the_long_side():
    """Batched float32 root F (1, 100, 2): an eigenvalue of F^T F at 5e-6 lambda_max lies below
    8 sqrt(100) eps32 = 9.5e-6 (a zero: no amplification) though above 8 sqrt(2) eps32; the size is the
    long side m = 100, not the batch or the rank."""
    u, _ = torch.linalg.qr(torch.randn(100, 2, generator=torch.Generator().manual_seed(10), dtype=F64))
    f = (u * torch.tensor([1.0, 5e-6 ** 0.5], dtype=F64)).float().unsqueeze(0)
    y = torch.randn(1, 100, 3, generator=torch.Generator().manual_seed(11)).float()
    got = lowrank_power_apply(f, y, -0.5).double()
    want = ref_power(f.double() @ f.double().transpose(-1, -2), -0.5,
                     zero_rel=8 * math.sqrt(100) * torch.finfo(torch.float32).eps) @ y.double()
    assert rel(got, want) < 1e-4
    assert float(got.norm()) < 2 * float(y.norm())      # the small direction was not amplified by 450
