"""Reference optimizers written from their published algorithms (independent of ``symo``).

- ``ReferenceMuon``: Keller Jordan's Muon (github.com/KellerJordan/Muon, ``muon.py``).
- ``ReferenceShampoo``: per-matrix Shampoo (Gupta, Koren, Singer 2018), plain, no grafting.
- ``pmuon_reference``: PMuon, Muon's step on the momentum preconditioned by powers of the gradient's
  covariances, polar(L^-gamma M R^-gamma), with the exact polar factor; its powers by ``helpers.ref_power``
  (a float64 eigh, no symo code).

They exist so the library's Muon-like and Shampoo-like modes (docs/theory.md §5) and its
then_orthogonalize kind can be compared against the algorithms as their authors wrote them,
conventions included.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from helpers import ref_power

F64 = torch.float64
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(
    G: torch.Tensor,
    steps: int = 5,
    coeffs: tuple[float, float, float] = NS_COEFFS,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Muon's ``zeropower_via_newtonschulz5``: approximate polar factor U V^T of G (2-D).

    X = G / (||G||_F + eps), transposed when rows > cols (so X X^T is the small Gram), then
    ``steps`` times: A = X X^T; B = b A + c A A; X = a X + B X. With the published quintic
    coefficients the singular values land roughly in [0.68, 1.13] rather than at 1 (by design:
    speed over accuracy). Computed in ``dtype`` (published: bfloat16; default here float32) and
    returned in that dtype. With coeffs (1.5, -0.5, 0.0) it is the classic cubic iteration,
    which converges to U V^T exactly.
    """
    if G.ndim != 2:
        raise ValueError(f"newton_schulz expects a matrix, got shape {tuple(G.shape)}")
    a, b, c = coeffs
    x = G.to(dtype)
    transpose = G.shape[0] > G.shape[1]
    if transpose:
        x = x.T
    x = x / (x.norm() + eps)
    for _ in range(steps):
        gram = x @ x.T
        poly = b * gram + c * gram @ gram
        x = a * x + poly @ x
    return x.T if transpose else x


class ReferenceMuon(torch.optim.Optimizer):
    """Muon, following the published ``muon_update`` and ``Muon.step`` exactly.

    Per step, for each parameter with gradient g (reshaped to (rows, -1) if ndim > 2):

        buf.lerp_(g, 1 - beta)                    # buf = beta buf + (1 - beta) g
        u = g.lerp(buf, beta) if nesterov else buf
        u = newton_schulz(u, ns_steps) * sqrt(max(1, rows / cols))
        p *= 1 - lr * weight_decay                # decoupled weight decay
        p -= lr * u

    The lerp form equals (1 - beta) times the classic form b = beta b + g, u = g + beta b
    (nesterov) or u = b; Newton-Schulz normalises by ||u||_F, so both give the same update up to
    the 1e-7 in that normalisation. The gradient tensor is not modified (the published code
    lerps it in place). Only parameters with ndim >= 2 are supported.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        weight_decay: float = 0.0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            weight_decay=weight_decay,
            dtype=dtype,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.ndim < 2:
                    raise ValueError("ReferenceMuon only handles parameters with ndim >= 2")
                g = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(g)
                buf = state["momentum_buffer"]
                buf.lerp_(g, 1 - beta)
                u = g.lerp(buf, beta) if group["nesterov"] else buf
                u = u.reshape(len(u), -1)
                u = newton_schulz(u, group["ns_steps"], dtype=group["dtype"])
                u = u * max(1.0, u.shape[0] / u.shape[1]) ** 0.5
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(u.reshape(p.shape).to(p.dtype), alpha=-group["lr"])
        return loss


def matrix_power_psd(
    M: torch.Tensor,
    p: float,
    eps: float = 0.0,
) -> torch.Tensor:
    """(M + eps I)^p for symmetric PSD M, by float64 eigh.

    Eigenvalues are clamped at 0 (roundoff) before eps is added. With eps == 0, eigenvalues
    <= 1e-12 * lam_max * n count as zero and map to 0 (pseudo-inverse semantics); with eps > 0
    nothing is thresholded.
    """
    m = M.to(torch.float64)
    m = (m + m.T) / 2
    evals, evecs = torch.linalg.eigh(m)
    evals = evals.clamp(min=0) + eps
    if eps == 0:
        zero = evals <= 1e-12 * evals.max() * m.shape[0]
    else:
        zero = torch.zeros_like(evals, dtype=torch.bool)
    safe = torch.where(zero, torch.ones_like(evals), evals)
    mapped = torch.where(zero, torch.zeros_like(evals), safe**p)
    return (evecs * mapped) @ evecs.T


class ReferenceShampoo(torch.optim.Optimizer):
    """Per-matrix Shampoo (Gupta et al. 2018), no grafting, no blocking.

    Conventions, for a 2-D parameter with gradient G (m x n), statistics starting at zero:

    - Statistics: beta2 None (default) sums, L += G G^T, R += G^T G (the paper's AdaGrad form);
      beta2 in (0, 1) is an EMA, L = beta2 L + (1 - beta2) G G^T (same for R), optionally divided
      by (1 - beta2^t) when bias_correction=True.
    - Damping: eps is added ABSOLUTELY, at root time, to the (bias-corrected) statistic:
      (L + eps I)^{-1/4}. The stored L is never damped. (The paper's L_0 = eps I is the same
      thing for the sum form.)
    - Direction: two-sided D = (L + eps I)^{-1/4} G (R + eps I)^{-1/4}; one_sided=True uses only
      the column statistic, D = G (R + eps I)^{-1/2}. A 1-D parameter (order-1 tensor) uses its
      full n x n statistic with exponent -1/2: d = (L + eps I)^{-1/2} g.
    - Roots by float64 eigh (``matrix_power_psd``), recomputed every step.
    - Momentum (off by default) is heavy-ball on the preconditioned direction:
      buf = momentum buf + D, and buf replaces D.
    - Step: p -= lr * D (plain SGD, no weight decay).

    From a single gradient G = U S V^T with tiny eps, both variants give D = U V^T.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        eps: float = 1e-12,
        beta2: float | None = None,
        bias_correction: bool = False,
        one_sided: bool = False,
        momentum: float = 0.0,
    ) -> None:
        defaults = dict(
            lr=lr,
            eps=eps,
            beta2=beta2,
            bias_correction=bias_correction,
            one_sided=one_sided,
            momentum=momentum,
        )
        super().__init__(params, defaults)

    @staticmethod
    def _accumulate(stat: torch.Tensor, new: torch.Tensor, beta2: float | None) -> None:
        if beta2 is None:
            stat.add_(new)
        else:
            stat.mul_(beta2).add_(new, alpha=1 - beta2)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta2, eps = group["beta2"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.ndim not in (1, 2):
                    raise ValueError("ReferenceShampoo handles 1-D and 2-D parameters only")
                g = p.grad.to(torch.float64)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    if p.ndim == 2:
                        state["L"] = torch.zeros(g.shape[0], g.shape[0], dtype=torch.float64)
                        state["R"] = torch.zeros(g.shape[1], g.shape[1], dtype=torch.float64)
                    else:
                        state["L"] = torch.zeros(g.shape[0], g.shape[0], dtype=torch.float64)
                state["step"] += 1
                corr = 1.0
                if beta2 is not None and group["bias_correction"]:
                    corr = 1 - beta2 ** state["step"]
                if p.ndim == 1:
                    self._accumulate(state["L"], torch.outer(g, g), beta2)
                    d = matrix_power_psd(state["L"] / corr, -0.5, eps) @ g
                else:
                    self._accumulate(state["L"], g @ g.T, beta2)
                    self._accumulate(state["R"], g.T @ g, beta2)
                    if group["one_sided"]:
                        d = g @ matrix_power_psd(state["R"] / corr, -0.5, eps)
                    else:
                        left = matrix_power_psd(state["L"] / corr, -0.25, eps)
                        right = matrix_power_psd(state["R"] / corr, -0.25, eps)
                        d = left @ g @ right
                if group["momentum"] > 0:
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(d)
                    buf = state["momentum_buffer"]
                    buf.mul_(group["momentum"]).add_(d)
                    d = buf
                p.add_(d.to(p.dtype), alpha=-group["lr"])
        return loss


def pmuon_reference(grads: list[torch.Tensor], lr: float, two_sided: bool, gamma=0.3, beta=0.95, beta2=0.95,
                    damping=1e-6, frequency=2) -> list[torch.Tensor]:
    """PMuon: Muon's Nesterov momentum u; L, R the bias-corrected EMAs of G G^T and G^T G; every `frequency`
    steps L^-gamma and R^-gamma; P = L^-gamma u R^-gamma rescaled to ||u||_F; update sqrt(max(1, m/n)) U V^T of P."""
    m, n = grads[0].shape
    mom = torch.zeros(m, n, dtype=F64)
    left, right = torch.zeros(m, m, dtype=F64), torch.zeros(n, n, dtype=F64)
    out = []
    for t, g in enumerate(grads, start=1):
        mom = beta * mom + (1 - beta) * g
        u = (1 - beta) * g + beta * mom
        left = beta2 * left + (1 - beta2) * g @ g.T
        right = beta2 * right + (1 - beta2) * g.T @ g
        if (t - 1) % frequency == 0:
            lp = ref_power(left / (1 - beta2 ** t), -gamma, damping) if two_sided else torch.eye(m, dtype=F64)
            rp = ref_power(right / (1 - beta2 ** t), -gamma, damping)
        p = lp @ u @ rp
        p = p * u.norm() / p.norm()
        uu, _, vh = torch.linalg.svd(p, full_matrices=False)
        out.append(lr * max(1.0, m / n) ** 0.5 * uu @ vh)
    return out
