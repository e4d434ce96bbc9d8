"""The two baselines of the paper's teacher-student experiment, written here as the paper describes them
(benchmarks/paper_mlp.py runs them): two-sided Shampoo per weight matrix and K-FAC per layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from benchmarks.paper_mlp import Net


def _sym_power(m: torch.Tensor, p: float) -> torch.Tensor:
    """U diag(s^p) V^T from the float64 SVD of a symmetric m (m^p when m is positive definite); in m's dtype.

    Singular values are |eigenvalues|: a float32 sum G^T G + eps I can have eigenvalues rounded below
    zero when eps is under its rounding (~1e-7 of the largest), and those then enter with |lambda|^p
    and their sign, finite, as in the paper's experiment, where a clamped eigh would give inf."""
    u, s, vh = torch.linalg.svd(m.double())
    return ((u * s.pow(p)) @ vh).to(m.dtype)


class Shampoo:
    """Two-sided Shampoo per weight matrix: L += G G^T, R += G^T G from eps I; w -= lr L^{-1/4} G R^{-1/4}."""

    def __init__(self, net: Net, lr: float, eps: float) -> None:
        self.mats = [net.fc1.weight, net.fc2.weight]
        self.lr = lr
        self.left = [eps * torch.eye(w.shape[0], dtype=w.dtype) for w in self.mats]
        self.right = [eps * torch.eye(w.shape[1], dtype=w.dtype) for w in self.mats]

    @torch.no_grad()
    def step(self) -> None:
        for w, left, right in zip(self.mats, self.left, self.right):
            g = w.grad
            left.add_(g @ g.T)
            right.add_(g.T @ g)
            w.sub_(self.lr * (_sym_power(left, -0.25) @ g @ _sym_power(right, -0.25)))


class KFAC:
    """K-FAC per layer: A = E[a a^T] of the layer input a and G = E[g g^T] of the pre-activation gradient g,
    EMA 0.9 (the first step sets them), w -= lr (G + d I)^{-1} grad (A + d I)^{-1}.

    g is the gradient of the mean training loss, as in the paper's experiment, for which its learning
    rates and dampings were chosen: a point's g is its residual / N, so G is the per-point curvature
    E[r r^T] / N^2, and the damping d dominates it. `per_point=True` uses N g (G = E[r r^T]) instead."""

    def __init__(self, net: Net, lr: float, damping: float, ema: float = 0.9, per_point: bool = False) -> None:
        self.net, self.lr, self.damping, self.ema, self.per_point = net, lr, damping, ema, per_point
        self.layers = [net.fc1, net.fc2]
        self.factors: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of the weights (into .grad) and of the pre-activations (kept for the factors)."""
        pre = [z for _, z in self.net.cache]
        grads = torch.autograd.grad(loss, [layer.weight for layer in self.layers] + pre)
        for layer, g in zip(self.layers, grads[:2]):
            layer.weight.grad = g
        self._pre_grads = grads[2:]

    @torch.no_grad()
    def step(self) -> None:
        new = []
        for (a, _), gz in zip(self.net.cache, self._pre_grads):
            n = a.shape[0]
            g = gz * n if self.per_point else gz
            new.append((a.T @ a / n, g.T @ g / n))
        if self.factors is None:
            self.factors = new
        else:
            self.factors = [(self.ema * fa + (1 - self.ema) * a, self.ema * fg + (1 - self.ema) * g)
                            for (fa, fg), (a, g) in zip(self.factors, new)]
        for layer, (fa, fg) in zip(self.layers, self.factors):
            eye_a = torch.eye(fa.shape[0], dtype=fa.dtype)
            eye_g = torch.eye(fg.shape[0], dtype=fg.dtype)
            left = torch.linalg.solve(fg + self.damping * eye_g, layer.weight.grad)      # (G + dI)^{-1} grad
            upd = torch.linalg.solve(fa + self.damping * eye_a, left.T).T              # ... (A + dI)^{-1}
            layer.weight.sub_(self.lr * upd)
