"""`symo.runtime.linalg` at the edges its docstrings state: the zero thresholds exactly, any number of batch axes,
per-block lambda_max in a batch, the defaults, and `float64_max` honoured by every decomposition.

The threshold tests use float data whose Gram is exactly diagonal (F has one nonzero per column), so the
eigenvalues are known to the last bit and can be placed just inside, just outside or exactly on a
threshold: a wrong size, constant or comparison there flips a direction whose weight is 1e5 to 1e7, far
beyond rounding. Mutation testing (scripts/mutation.sh) found each rule here unchecked before.
"""

from __future__ import annotations

import math

import pytest
import torch
from cases import blocks
from helpers import ref_power, rel

from symo.runtime.linalg import (
    geometric_mean,
    gram_power_apply,
    inv_sqrt_newton_schulz,
    lowrank_power_apply,
    root_power,
    sym_power,
)

F64, F32 = torch.float64, torch.float32
EPS32, EPS64 = torch.finfo(F32).eps, torch.finfo(F64).eps


def diagonal_root(m: int, singular: list[float], dtype: torch.dtype) -> torch.Tensor:
    """F (m x r) with F[i, i] = singular[i] and zeros elsewhere: F^T F = diag(singular^2), exactly."""
    f = torch.zeros(m, len(singular), dtype=dtype)
    for i, s in enumerate(singular):
        f[i, i] = s
    return f


# ------------------------------------------------------------------ undamped float32: the float64-Gram rule
def test_float64_gram_rule_is_8_size_eps32_squared():
    """Undamped float32 root (7 x 3): eigenvalues of F^T F at or below 8 max(m, r) eps32^2 lambda_max = 56 eps32^2
    are zeros. 60 eps32^2 is kept (S^{-1/2} weight 1 / (7.7 eps32) ~ 1e6), 20 eps32^2 is dropped."""
    f = diagonal_root(7, [1.0, math.sqrt(60) * EPS32, math.sqrt(20) * EPS32], F32)
    r = root_power(f, -0.5)
    assert r.dtype == F32
    got = (r.double() @ r.double().T)
    want = torch.zeros(7, 7, dtype=F64)
    want[0, 0], want[1, 1] = 1.0, 1.0 / float(f[1, 1])     # (s^2)^{-1/2}; the 20 eps^2 direction is a zero
    assert rel(got, want) < 1e-6
    # with a batch axis in front of size 40 (> m) the size is still m = 7, not a batch dimension
    batched = root_power(f.expand(1, 40, 7, 3).contiguous(), -0.5).double()
    assert rel(batched @ batched.transpose(-1, -2), want.expand(1, 40, 7, 7)) < 1e-6


def test_float64_gram_rule_at_the_threshold_is_a_zero():
    """'At or below' the threshold: F = diag(1, 2^-21) in float32 has F^T F = diag(1, 2^-42), and
    8 max(m, r) eps32^2 = 16 * 2^-46 = 2^-42 exactly, so the second direction is a zero (rank 1)."""
    f = diagonal_root(2, [1.0, 2.0 ** -21], F32)
    r = root_power(f, -0.5).double()
    assert torch.equal(r @ r.T, torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=F64))
    # gram_power_apply, the same rule: (Y Y^T)^{-1} Y = diag(1, 0) for Y = F (not diag(1, 2^21))
    assert torch.equal(gram_power_apply(f, -1.0, 1), torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=F32))


def test_float64_gram_rule_per_block_in_a_batch():
    """A batch of three float32 roots of very different scales, each with a small real direction (singular
    value 1e-4 of its own largest): lambda_max is each block's own, and the result keeps the input dtype."""
    gen = torch.Generator().manual_seed(20)
    u, _ = torch.linalg.qr(torch.randn(3, 7, 2, generator=gen, dtype=F64))
    scales = torch.tensor([1.0, 1e3, 1e-4], dtype=F64).view(3, 1, 1)
    f = (u * torch.tensor([1.0, 1e-4], dtype=F64) * scales).float()
    r = root_power(f, -0.5)
    assert r.dtype == F32 and r.shape == f.shape
    zero_rel = 8 * 7 * EPS32 ** 2
    for k in range(3):
        want = ref_power(f[k].double() @ f[k].double().T, -0.5, zero_rel=zero_rel)
        assert rel(r[k].double() @ r[k].double().T, want) < 1e-5, k
        # the float32 data itself resolves the 1e-4 direction: it carries the weight 1e4 / scale
        assert torch.linalg.matrix_rank(want, rtol=1e-12) == 2, k
    y = (u.transpose(-1, -2) * scales).float()                         # wide float32 Y: gram_power_apply too
    got = gram_power_apply(y, -0.5, 1)
    assert got.dtype == F32
    for k in range(3):
        want = ref_power(y[k].double() @ y[k].double().T, -0.5, zero_rel=zero_rel) @ y[k].double()
        assert rel(got[k].double(), want) < 1e-5, k


# ------------------------------------------------------------------ damped float64: 8 sqrt(size) eps with size m
def test_zero_rule_size_is_the_long_side_with_any_batch_axes():
    """Damped float64 F (7 x 4), eigenvalues of F^T F at 1, 31 eps, 22.5 eps and 17.9 eps: the threshold
    8 sqrt(7) eps = 21.2 eps keeps the second and third (relative damping then gives them (0.1)^{-1/2}) and
    drops the fourth; 9 sqrt(7) or 8 * 7 / 2 would drop the third. With one batch axis of size 1 or two batch
    axes (1, 40), neither the rank 4 nor a batch size is taken for m. sym_power on F F^T follows the same rule."""
    f = diagonal_root(7, [1.0, math.sqrt(31 * EPS64), math.sqrt(22.5 * EPS64), math.sqrt(17.9 * EPS64)], F64)
    want = ref_power(f @ f.T, -0.5, 0.1)
    assert torch.linalg.matrix_rank(want, rtol=1e-12) == 3          # the reference's own rule, as stated above
    for lead in ((1,), (1, 40)):
        fb = f.expand(*lead, 7, 4).contiguous()
        r = root_power(fb, -0.5, 0.1)
        assert rel(r @ r.transpose(-1, -2), want.expand(*lead, 7, 7)) < 1e-10, lead
        y = torch.eye(7, dtype=F64).expand(*lead, 7, 7)
        assert rel(lowrank_power_apply(fb, y, -0.5, 0.1), want.expand(*lead, 7, 7)) < 1e-10, lead
        assert rel(sym_power(fb @ fb.transpose(-1, -2), -0.5, 0.1), want.expand(*lead, 7, 7)) < 1e-10, lead


def test_lowrank_power_apply_defaults_to_relative_damping():
    """Without `absolute=`, damping is relative (x + damping lambda_max, zero off the range), as documented."""
    gen = torch.Generator().manual_seed(21)
    f = torch.randn(2, 8, 3, generator=gen, dtype=F64) * torch.tensor([1.0, 1e2], dtype=F64).view(2, 1, 1)
    y = torch.randn(2, 8, 5, generator=gen, dtype=F64)
    got = lowrank_power_apply(f, y, -0.5, 0.1)
    assert rel(got, ref_power(f @ f.transpose(-1, -2), -0.5, 0.1) @ y) < 1e-10
    assert rel(got, ref_power(f @ f.transpose(-1, -2), -0.5, 0.1, absolute=True) @ y) > 1e-2


def test_inverse_root_newton_schulz_with_two_batch_axes():
    """(..., m, m) means any batch axes: a (2, 3, 4, 4) batch equals its blocks one by one."""
    a = torch.stack([blocks(m=4, ranks=(4, 4, 4), scales=(1.0, 10.0, 0.1), seed=s) for s in (22, 23)])
    got = inv_sqrt_newton_schulz(a, 60, 0.05)
    for i in range(2):
        for j in range(3):
            frob = float(torch.linalg.matrix_norm(a[i, j]))
            want = ref_power(a[i, j] + 0.05 * frob * torch.eye(4, dtype=F64), -0.5)
            assert rel(got[i, j], want) < 1e-10, (i, j)


# ------------------------------------------------------------------ float64_max reaches every eigh
@pytest.mark.parametrize("name", ["sym_power", "root_power", "gram_power_apply", "lowrank_power_apply",
                                  "geometric_mean"])
def test_float64_max_zero_decomposes_everything_in_float32(monkeypatch, name):
    """float64_max=0 on float32 blocks: every eigendecomposition runs in float32 (the speed the option is
    for), and with the default every one runs in float64; the dtype of each call is recorded."""
    gen = torch.Generator().manual_seed(24)
    f = torch.randn(2, 7, 3, generator=gen)
    y = torch.randn(2, 7, 5, generator=gen)
    a = f @ f.transpose(-1, -2) + 0.1 * torch.eye(7)
    calls = {
        "sym_power": lambda m: sym_power(a, -0.5, 1e-3, float64_max=m),
        "root_power": lambda m: root_power(f, -0.5, 1e-3, float64_max=m),
        "gram_power_apply": lambda m: gram_power_apply(y, -0.5, 3, 1e-3, float64_max=m),
        "lowrank_power_apply": lambda m: lowrank_power_apply(f, y, -0.5, 1e-3, float64_max=m),
        "geometric_mean": lambda m: geometric_mean(a, a @ a, float64_max=m),
    }
    real, seen = torch.linalg.eigh, []

    def spy(x, *args, **kwargs):
        seen.append(x.dtype)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "eigh", spy)
    if name == "sym_power":   # the size is the block's side (4), not a batch axis (9)
        sym_power(torch.eye(4).expand(1, 9, 4, 4), -0.5, 1e-3, float64_max=5)
        assert seen == [F64], seen
        seen.clear()
    calls[name](0)
    assert seen and set(seen) == {F32}, seen
    seen.clear()
    calls[name](512)
    assert seen and set(seen) == {F64}, seen


# ------------------------------------------------------------------ gram_power_apply's float64-Gram route
@pytest.mark.parametrize("tall", [False, True])
def test_gram_power_apply_float32_undamped_divides_by_dim_on_either_side(tall):
    """Undamped float32 Y, 3 x 7 or 7 x 3, with eigenvalues of Y Y^T exactly 1, 60 eps32^2 and 20 eps32^2:
    (Y Y^T / 5)^{-1/2} Y keeps the first two (each row of Y becomes sqrt(5) e_i) and zeros the third, which
    lies below 8 max(m, n) eps32^2 lambda_max = 56 eps32^2 whatever the scale dim."""
    f = diagonal_root(7, [1.0, math.sqrt(60) * EPS32, math.sqrt(20) * EPS32], F32)
    y = f if tall else f.T.contiguous()
    got = gram_power_apply(y.unsqueeze(0), -0.5, 5)[0]
    assert got.dtype == F32 and got.shape == y.shape
    want = math.sqrt(5) * diagonal_root(7, [1.0, 1.0, 0.0], F64)
    assert rel(got.double(), want if tall else want.T) < 1e-6


def test_gram_power_apply_float64_gram_up_to_accurate_gram_max(monkeypatch):
    """The float64 Gram is used while the smaller side is at most ACCURATE_GRAM_MAX (set to 3 here): a
    float32 Y with singular values (1, 1, 3e-4) keeps the 3e-4 direction (its eigenvalue 9e-8 is far above
    8 m eps32^2); with a fourth column the smaller side is 4 and the float32 Gram's rule,
    8 sqrt(4) eps32 = 1.9e-6 > 9e-8, makes it a zero (docs of ACCURATE_GRAM_MAX)."""
    from symo.runtime import linalg

    monkeypatch.setattr(linalg, "ACCURATE_GRAM_MAX", 3)
    kept = gram_power_apply(diagonal_root(6, [1.0, 1.0, 3e-4], F32).unsqueeze(0), -0.5, 1)[0]
    assert rel(kept.double(), diagonal_root(6, [1.0, 1.0, 1.0], F64)) < 1e-5
    dropped = gram_power_apply(diagonal_root(6, [1.0, 1.0, 1.0, 3e-4], F32).unsqueeze(0), -0.5, 1)[0]
    assert rel(dropped.double(), diagonal_root(6, [1.0, 1.0, 1.0, 0.0], F64)) < 1e-5


@pytest.mark.parametrize("shape", [(3, 4, 9), (3, 9, 4)])
def test_gram_power_apply_float32_undamped_per_block(shape):
    """Random float32 blocks of different scales through the float64-Gram route: the dense reference per
    block, (Y Y^T / d)^{-1/2} Y with float64 eigh (eigenvectors of a generic 4 x 4 Gram, not symmetric)."""
    gen = torch.Generator().manual_seed(25)
    y = (torch.randn(*shape, generator=gen, dtype=F64) * torch.tensor([1.0, 1e2, 1e-2], dtype=F64).view(3, 1, 1))
    y = y.float()
    got = gram_power_apply(y, -0.5, 5)
    assert got.dtype == F32
    for k in range(3):
        yk = y[k].double()
        want = ref_power(yk @ yk.T / 5, -0.5, zero_rel=8 * 9 * EPS32 ** 2) @ yk
        assert rel(got[k].double(), want) < 1e-6, k
