"""Matrix functions of the small symmetric factors: exact (eigh) and Newton–Schulz.

Conventions of docs/theory.md: damping is relative, x -> x + damping * lambda_max per block; eigenvalues
that are zero to working precision map to zero (pseudo-inverse semantics), so a rank-deficient
single-gradient S still has a well-defined S^{-1/2} on its support. `absolute=True` selects
Shampoo's convention instead, x -> x + damping on every kept eigenvalue: zeros to working precision still
map to zero, since a gradient has no component there but rounding noise, which damping^p (1e4 for
Shampoo's 1e-8 at -1/2) would amplify without bound as the gradient's scale grows.
"""

from __future__ import annotations

import torch

# eigh runs in float64 up to this size (cheap and exact); larger blocks stay in their own dtype and
# retry in float64 only if the float32 solver fails to converge.
FLOAT64_EIGH_MAX = 512

# Undamped powers of Grams of float32 (or lower) data: the Gram of the smaller side is formed and
# decomposed in float64 up to this size. A float32 Gram cannot resolve singular values below
# ~sqrt(eps32) sigma_max ~ 3e-4 sigma_max, and a square Gaussian matrix has real ones there.
ACCURATE_GRAM_MAX = 2048

# Muon's quintic Newton–Schulz coefficients (Keller Jordan, 2024).
MUON_COEFFS = (3.4445, -4.7750, 2.0315)

# Muon's Newton–Schulz on CPU, `spectral_ns_is_cheaper`: a float64 Gram and eigh pay off only for wide
# blocks from this smaller side on; above FLOAT64_EIGH_MAX (float32 eigh) always.
SPECTRAL_NS_MIN = 256
SPECTRAL_NS_ASPECT = 2.5


def _eigh(a: torch.Tensor, float64_max: int = FLOAT64_EIGH_MAX) -> tuple[torch.Tensor, torch.Tensor]:
    # small blocks in float64; never lower the precision of float64 input
    work = torch.float64 if a.shape[-1] <= float64_max or a.dtype == torch.float64 else torch.float32
    try:
        return torch.linalg.eigh(a.to(work))
    except RuntimeError:  # ill-conditioned input that the float32 solver did not converge on
        return torch.linalg.eigh(a.to(torch.float64))


def zero_threshold(lam_max: torch.Tensor, size: int, dtype: torch.dtype) -> torch.Tensor:
    """8 sqrt(size) eps lambda_max: eigenvalues at or below it are exact zeros (eps of the data's dtype).

    A Gram formed in working precision has eigenvalue errors of about eps * lambda_max (Weyl), and
    true zeros come out there (measured: 0.7 eps lambda_max for a 512 x 1024 float32 gradient); the
    margin 8 sqrt(size) keeps them out of S^{-1/2} while discarding fewer real small directions
    than numpy's size * eps rule, which is meant for singular values, not their squares. Every
    working-precision power in Symo uses this rule (the float64 Gram of float32 data has its own,
    `_float64_gram_eigh`)."""
    return lam_max * (8 * size ** 0.5 * torch.finfo(dtype).eps)


def _zero_tol(evals: torch.Tensor, size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The zero threshold of a batch of eigenvalues (..., size) and their largest (clamped at 0)."""
    lam_max = evals.amax(dim=-1, keepdim=True).clamp_min(0)
    return zero_threshold(lam_max, size, dtype), lam_max


def spectral_fn(evals: torch.Tensor, p: float, damping: float, size: int, dtype: torch.dtype,
                absolute: bool = False) -> torch.Tensor:
    """f(x) = (x + damping * lambda_max)^p on the support, 0 off it.

    `absolute=True`: f(x) = (x + damping)^p on the support, 0 off it.
    """
    tol, lam_max = _zero_tol(evals, size, dtype)
    keep = evals > tol
    shift = damping if absolute else damping * lam_max
    shifted = torch.where(keep, evals + shift, torch.ones_like(evals))
    return torch.where(keep, shifted.pow(p), torch.zeros_like(evals))


def sym_power(a: torch.Tensor, p: float, damping: float = 0.0,
              float64_max: int = FLOAT64_EIGH_MAX, *, absolute: bool = False) -> torch.Tensor:
    """A^p for a batch of symmetric PSD matrices (..., m, m), through eigh."""
    evals, evecs = _eigh(a, float64_max)
    f = spectral_fn(evals, p, damping, a.shape[-1], a.dtype, absolute)
    return ((evecs * f.unsqueeze(-2)) @ evecs.transpose(-1, -2)).to(a.dtype)


def _accurate(data: torch.Tensor, damping: float, absolute: bool) -> bool:
    """Take the float64 route: undamped (relative) power of data below float64 with a small Gram side."""
    return (damping == 0 and not absolute and data.dtype != torch.float64
            and min(data.shape[-2], data.shape[-1]) <= ACCURATE_GRAM_MAX)


def _float64_gram_eigh(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """eigh of F^T F formed in float64, and the zero threshold for F's own precision.

    The float64 Gram of the data as stored is exact to float64 rounding, so its eigenvalues resolve
    every singular value the data holds. What separates a true zero from a real direction is then the
    rounding of the data itself: entries off by eps(data) make singular values of at most
    eps ||F||_F <= eps sqrt(r) sigma_max, so eigenvalues below 8 size eps(data)^2 lambda_max are zeros
    (sigma below ~1e-5 sigma_max for float32 at size 1024): rank-deficient gradients cannot blow up."""
    f64 = f.to(torch.float64)
    evals, evecs = torch.linalg.eigh(f64.transpose(-1, -2) @ f64)
    size = max(f.shape[-2], f.shape[-1])
    lam_max = evals.amax(dim=-1, keepdim=True).clamp_min(0)
    return evals, evecs, lam_max * (8 * size * torch.finfo(f.dtype).eps ** 2)


def _undamped(evals: torch.Tensor, tol: torch.Tensor, p: float) -> torch.Tensor:
    keep = evals > tol
    return torch.where(keep, torch.where(keep, evals, torch.ones_like(evals)).pow(p), torch.zeros_like(evals))


def root_power(f: torch.Tensor, p: float, damping: float = 0.0,
               float64_max: int = FLOAT64_EIGH_MAX) -> torch.Tensor:
    """For S = F F^T with F (..., m, r), r <= m: a root F' with S^p = F' F'^T, using only the r x r Gram.

    F^T F = W L W^T, so S = (F W L^{-1/2}) L (F W L^{-1/2})^T and S^p has the root F W (f(L) / L)^{1/2}.
    Undamped powers of float32 roots form and decompose the Gram in float64 (see `_float64_gram_eigh`).
    """
    if _accurate(f, damping, False):
        evals, evecs, tol = _float64_gram_eigh(f)
        fl = _undamped(evals, tol, p)
        scale = torch.where(fl > 0, (fl / torch.where(fl > 0, evals, torch.ones_like(evals))).sqrt(),
                            torch.zeros_like(fl))
        return (f.to(torch.float64) @ (evecs * scale.unsqueeze(-2))).to(f.dtype)
    gram = f.transpose(-1, -2) @ f
    evals, evecs = _eigh(gram, float64_max)
    fl = spectral_fn(evals, p, damping, max(f.shape[-2], f.shape[-1]), f.dtype)
    scale = torch.where(fl > 0, (fl / evals.clamp_min(torch.finfo(evals.dtype).tiny)).sqrt(),
                        torch.zeros_like(fl))
    return f @ (evecs * scale.unsqueeze(-2)).to(f.dtype)


def newton_schulz(x: torch.Tensor, steps: int = 5, coeffs: tuple[float, float, float] = MUON_COEFFS,
                  eps: float = 1e-7) -> torch.Tensor:
    """Approximate polar factor U V^T of x (..., m, n) by Muon's quintic iteration.

    Muon's coefficients do not converge to the polar factor exactly: singular values land in roughly
    [0.7, 1.2], which is what Muon uses and what the `"newton_schulz"` backend reproduces.
    """
    a, b, c = coeffs
    transpose = x.shape[-2] > x.shape[-1]
    y = x.transpose(-1, -2) if transpose else x
    y = y / (y.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        gram = y @ y.transpose(-1, -2)
        poly = b * gram + c * gram @ gram
        y = a * y + poly @ y
    return y.transpose(-1, -2) if transpose else y


def newton_schulz_spectral(x: torch.Tensor, steps: int = 5, coeffs: tuple[float, float, float] = MUON_COEFFS,
                           eps: float = 1e-7, float64_max: int = FLOAT64_EIGH_MAX) -> torch.Tensor:
    """`newton_schulz(x)` evaluated through the eigendecomposition of x's smaller Gram matrix.

    Each quintic step is X <- p(X X^T) X with p(s) = a + b s + c s^2, so every iterate is a polynomial
    in A = X_0 X_0^T applied to X_0, and on an eigenvector of A the step multiplies by p(s_k) and maps
    the eigenvalue s_k to s_k p(s_k)^2. With A = V diag(s) V^T the result is V diag(m) V^T X_0, m the
    product of the p(s_k) per eigenvalue: the same map as the iteration, for one Gram, one eigh and
    two products instead of 3 x steps products; on CPU the cheaper way for the shapes that
    `spectral_ns_is_cheaper` names.

    Precision: unlike the iteration, an eigendecomposition mixes eigenvectors across small gaps, and
    a gradient's near-zero directions (where the map multiplies by a^steps ~ 480) make that visible.
    Up to `float64_max` the Gram is therefore formed and decomposed in float64, which matches the
    float32 iteration's accuracy (~1e-5 relative to the float64 iteration on real gradients). Above
    it both stay in the data's dtype, as `sym_power` does, since a float64 eigh there costs as much
    as the iteration: on ill-conditioned low-rank float32 inputs the result is then 1e-3 to 4e-3
    from the float64 iteration, where the float32 iteration is ~2e-5 and Muon's bfloat16 one 0.25
    to 0.4 (tests/test_spectral_ns.py). `SymoConfig(ns_method="iterate")` keeps the iteration.
    """
    a, b, c = coeffs
    wide = x.shape[-2] <= x.shape[-1]
    y = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    work = y.to(torch.float64) if min(x.shape[-2], x.shape[-1]) <= float64_max else y
    gram = work @ work.transpose(-1, -2) if wide else work.transpose(-1, -2) @ work
    evals, evecs = _eigh(gram, float64_max)
    s = evals.to(torch.float64).clamp_min(0)  # rounding can make a zero eigenvalue slightly negative
    m = torch.ones_like(s)
    for _ in range(steps):
        poly = a + b * s + c * s * s
        m, s = m * poly, s * poly * poly
    power = ((evecs * m.to(evecs.dtype).unsqueeze(-2)) @ evecs.transpose(-1, -2)).to(y.dtype)
    return power @ y if wide else y @ power


def spectral_ns_is_cheaper(shape: tuple[int, ...] | torch.Size) -> bool:
    """CPU cost model: is `newton_schulz_spectral` cheaper than the 5-step iteration on a (..., m, n) block?

    Measured on one core (tests/test_spectral_ns.py names the rule; timings in docs/performance.md):
    with a float32 eigh (smaller side > FLOAT64_EIGH_MAX) it takes 0.4-0.6x the iteration's time at
    every shape tried; with the float64 Gram and eigh it wins only when the block is wide enough for
    the iteration's rectangular products to dominate (0.70x at 384 x 1152, 1.1-1.5x for square and
    1:2 blocks up to 512, and slower for every shape with a side of 128)."""
    short, long = sorted((int(shape[-2]), int(shape[-1])))
    if short > FLOAT64_EIGH_MAX:
        return True
    return short >= SPECTRAL_NS_MIN and long >= SPECTRAL_NS_ASPECT * short


def gram_power_apply(y: torch.Tensor, p: float, dim: int, damping: float = 0.0, *, absolute: bool = False,
                     float64_max: int = FLOAT64_EIGH_MAX) -> torch.Tensor:
    """(Y Y^T / dim)^p Y for Y (..., m, n) through the smaller Gram matrix (docs/theory.md).

    f(Y Y^T) Y = Y f(Y^T Y) for every spectral function f, damping and pseudo-inverse included, so an
    m x n block costs one min(m, n)-sized eigh. Undamped powers of float32 data go through a float64
    Gram (see `_float64_gram_eigh`).
    """
    yt = y.transpose(-1, -2)
    if _accurate(y, damping, absolute):
        wide = y.shape[-2] <= y.shape[-1]
        f = yt if wide else y  # the root whose Gram is the smaller side
        evals, evecs, tol = _float64_gram_eigh(f)
        fl = _undamped(evals / dim, tol / dim, p)
        power = (evecs * fl.unsqueeze(-2)) @ evecs.transpose(-1, -2)
        y64 = y.to(torch.float64)
        return (power @ y64 if wide else y64 @ power).to(y.dtype)
    if y.shape[-2] <= y.shape[-1]:
        return sym_power((y @ yt) / dim, p, damping, float64_max, absolute=absolute) @ y
    return y @ sym_power((yt @ y) / dim, p, damping, float64_max, absolute=absolute)


def lowrank_power_apply(f: torch.Tensor, y: torch.Tensor, p: float, damping: float = 0.0, *,
                        absolute: bool = False, float64_max: int = FLOAT64_EIGH_MAX) -> torch.Tensor:
    """(F F^T)^p Y for a root F (..., m, r) with r < m, using only the r x r Gram of F.

    With F^T F = W L W^T, (F F^T)^p = F W (g(L) / L) W^T F^T + g(0) (I - projector onto range F),
    where g is the damped power and g(0) = 0 (zeros map to zero under both damping conventions).
    """
    evals, evecs = _eigh(f.transpose(-1, -2) @ f, float64_max)
    size = max(f.shape[-2], f.shape[-1])
    g = spectral_fn(evals, p, damping, size, f.dtype, absolute)
    tol, _ = _zero_tol(evals, size, f.dtype)
    on = evals > tol
    safe = torch.where(on, evals, torch.ones_like(evals))
    fw = f @ evecs.to(f.dtype)                                   # columns F w_i, norms sqrt(L_i)
    coef = fw.transpose(-1, -2) @ y                              # (w_i^T F^T) Y
    scale = torch.where(on, g / safe, torch.zeros_like(g)).to(f.dtype)
    return fw @ (scale.unsqueeze(-1) * coef)


def inv_sqrt_newton_schulz(a: torch.Tensor, steps: int = 25, damping: float = 0.0, *,
                           absolute: bool = False) -> torch.Tensor:
    """(A + delta I)^{-1/2} for symmetric PSD A (..., m, m) by the coupled Newton–Schulz iteration.

    Only matrix products, so it suits large blocks on accelerators. A is scaled by its Frobenius norm
    (>= lambda_max) so the spectrum lies in (0, 1]; relative damping is taken against that norm.
    Y_0 = A / c, Z_0 = I; T = (3 I - Z Y) / 2; Y <- Y T; Z <- T Z; then Z / sqrt(c) -> A^{-1/2}.
    Eigenvalues below about 1.5^-steps of the norm are under-inverted (an implicit extra damping).
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norm = a.norm(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
    delta = damping if absolute else damping * norm
    c = norm + delta
    y = (a + delta * eye) / c
    z = eye.expand_as(a)
    for _ in range(steps):
        t = 1.5 * eye - 0.5 * (z @ y)
        y, z = y @ t, t @ z
    return z / c.sqrt()


def ns_inverse_root_min_damping(steps: int, dtype: torch.dtype) -> float:
    """The smallest damping, relative to ||A||_F, at which `inv_sqrt_newton_schulz` is accurate.

    Two limits. Convergence: a scaled eigenvalue x far below 1 grows by about 2.25 per coupled step
    and then needs a few steps to converge, so `steps` steps reach x >= 2.25^-(steps - 5)
    (25 steps: 9e-8). Rounding: the products perturb every eigenvalue by about eps ||A||, a relative
    error of eps / x on the damped floor x, so x must be at least 100 eps (float32: 1.2e-5, for ~1e-3
    relative error; float64: the convergence limit decides). Measured (tests/test_block_numerics.py):
    at this floor the result is within 1e-3 (float32) and 1e-8 (float64) of the float64 eigh root.
    """
    return max(2.25 ** -(steps - 5), 100 * torch.finfo(dtype).eps)


def ns_inverse_root_is_accurate(a: torch.Tensor, steps: int, damping: float, absolute: bool) -> bool:
    """Whether `inv_sqrt_newton_schulz(a, steps, damping)` is accurate (see `ns_inverse_root_min_damping`).

    Relative damping is decided from the numbers alone. Absolute damping never: its zeros map to zero
    (`spectral_fn`), which the iteration, converging to (A + damping I)^{-1/2}, cannot do."""
    return not absolute and damping >= ns_inverse_root_min_damping(steps, a.dtype)


def geometric_mean(a: torch.Tensor, b: torch.Tensor, float64_max: int = FLOAT64_EIGH_MAX) -> torch.Tensor:
    """A # B = A^{1/2} (A^{-1/2} B A^{-1/2})^{1/2} A^{1/2} for symmetric positive definite A, PSD B.

    The unique positive solution X of X A^{-1} X = B (docs/theory.md, the "taylor" estimator).
    """
    half, ihalf = sym_power(a, 0.5, 0.0, float64_max), sym_power(a, -0.5, 0.0, float64_max)
    inner = ihalf @ b @ ihalf
    inner = (inner + inner.transpose(-1, -2)) / 2
    return half @ sym_power(inner, 0.5, 0.0, float64_max) @ half


def taylor_mean(sg: torch.Tensor, sw: torch.Tensor, damping: float, absolute: bool = False,
                lam_floor: float = 1e-30) -> torch.Tensor:
    """The taylor estimator's H = (S_w + delta I)^{-1} # S_g, symmetrised: the solution of
    H S_w H = S_g with S_w damped by delta = max(damping, 1e-8), times S_w's largest eigenvalue
    (at least `lam_floor`) unless `absolute` (S_w is often rank deficient)."""
    eye = torch.eye(sw.shape[-1], dtype=sw.dtype, device=sw.device)
    delta = max(damping, 1e-8)
    if not absolute:
        delta = delta * torch.linalg.matrix_norm(sw, ord=2, keepdim=True).clamp_min(lam_floor)
    h = geometric_mean(sym_power(sw + delta * eye, -1.0), sg)
    return (h + h.transpose(-1, -2)) / 2


def eigh_basis(average: torch.Tensor, descending: bool, null_basis: str = "eigh") -> torch.Tensor:
    """The eigenvectors of a batch of symmetric statistics (batch, n, n), by ascending or descending eigenvalue;
    the decomposition in float64, the result in the statistic's dtype. null_basis="coordinates": the directions
    whose eigenvalue is zero to the statistic's precision get `nearest_coordinate_basis` of their span instead
    of eigh's basis of it, which rounding alone decides."""
    evals, evecs = torch.linalg.eigh(average.to(torch.float64))
    if null_basis == "coordinates":
        lam = evals[..., -1:].clamp_min(0)
        evecs = nearest_coordinate_basis(evecs, evals <= zero_threshold(lam, average.shape[-1], average.dtype))
    return (evecs.flip(-1) if descending else evecs).to(average.dtype)


def pivoted_rows(u: torch.Tensor) -> list[int]:
    """The k rows of u (n x k) that a QR of u^T with column pivoting picks (Businger-Golub): each time the row
    of largest norm once its components along the rows already picked are removed (ties: the lowest index)."""
    residual, picked = u.clone(), []
    for _ in range(u.shape[1]):
        norms = (residual * residual).sum(dim=1)
        norms[picked] = -1.0
        j = int(norms.argmax())
        picked.append(j)
        direction = residual[j] / residual[j].norm()
        residual = residual - torch.outer(residual @ direction, direction)
    return picked


def nearest_coordinate_basis(evecs: torch.Tensor, null: torch.Tensor) -> torch.Tensor:
    """`evecs` (batch, n, n) with each element's columns marked in `null` (batch, n) replaced by the orthonormal
    basis of their span nearest the coordinate axes: U R with R orthogonal maximising tr(U[J] R) (Procrustes),
    J the k coordinates a column-pivoted QR of U^T picks, in increasing order. It depends on the span alone,
    not on the basis U that eigh returned, so a perturbation that leaves the span in place leaves it in place."""
    out = evecs.clone()
    for i in range(evecs.shape[0]):
        cols = null[i].nonzero().squeeze(-1)
        if cols.numel() == 0:
            continue
        u = evecs[i][:, cols].to(torch.float64)
        rows = torch.as_tensor(sorted(pivoted_rows(u)), device=u.device)
        w, _, vh = torch.linalg.svd(u[rows])
        out[i][:, cols] = (u @ (vh.mT @ w.mT)).to(out.dtype)
    return out


def power_qr_basis(average: torch.Tensor, previous: torch.Tensor, iterations: int = 1, lift: float | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """SOAP's refresh of an eigenbasis (symo.optim.PowerQR): the previous basis's columns sorted by their
    estimated eigenvalues diag(Q^T A Q), descending (the order is returned, for the state kept per column), then
    `iterations` times Q <- qr(A Q).Q, the first product shifted by heavyball's lift when `lift` is a number."""
    q = previous.to(average.dtype)
    product = average @ q
    estimate = (q * product).sum(dim=-2)
    order = torch.argsort(estimate, dim=-1, descending=True)
    if lift is not None:
        noise = min(64 * average.shape[-1] * torch.finfo(average.dtype).eps, 0.125)
        top = estimate.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(average.dtype).tiny)
        product = product + (max(lift, noise) * top).unsqueeze(-2) * q
    q = torch.linalg.qr(product.gather(-1, order.unsqueeze(-2).expand_as(product))).Q
    for _ in range(iterations - 1):
        q = torch.linalg.qr(average @ q).Q
    return q, order
