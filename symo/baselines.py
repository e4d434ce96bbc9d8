"""Baseline curvature estimators for `symo.hessian.compare` (and for preconditioning in benchmarks).

Each is fed the same gradient stream (`update(grads)`; K-FAC also needs layer inputs and output
gradients, recorded by hooks) and represents an estimate H_hat of the Hessian with `.matvec(v)`,
`.power(p, damping)` (an estimator of the same kind holding H_hat^p) and `.dense()` (P x P, in
`param_names` order). Accumulation: `beta=None` is a running sum (original Shampoo / AdaGrad), else
an EMA with bias correction.

- `Shampoo`: two-sided, H ~ L^{1/4} (x) R^{1/4} with L = sum G G^T, R = sum G^T G for every
  matrix (tensors of more dimensions are reshaped to (shape[0], -1)); H ~ L^{1/2} for a vector.
- `KFAC`: for `nn.Linear` layers, H ~ G (x) A with A = E[a a^T] over layer inputs (augmented by 1
  for the bias) and G = E[d d^T] over per-sample gradients of the layer's outputs (the empirical
  Fisher's Kronecker factors; weight and bias form one block).
- `Diagonal`: Adam's sqrt(v), v the EMA of g^2.
- `Identity`: H_hat = I.

Damping in `power` is relative, per factor: x -> x + damping * lambda_max(factor), and exact zeros map
to zero for negative powers (docs/theory.md, the convention of `symo.Curvature`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from .runtime.linalg import sym_power

Tensors = Mapping[str, torch.Tensor]


class _Accumulator:
    """Running sum (beta None) or bias-corrected EMA of per-key statistics."""

    def __init__(self, beta: float | None) -> None:
        if beta is not None and not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be None (running sum) or in [0, 1); got {beta}")
        self.beta = beta
        self.steps = 0
        self.stats: dict[str, torch.Tensor] = {}

    def add(self, stats: dict[str, torch.Tensor]) -> None:
        self.steps += 1
        for k, s in stats.items():
            s = s.detach().double()
            if k not in self.stats:
                self.stats[k] = s.clone() if self.beta is None else (1 - self.beta) * s
            elif self.beta is None:
                self.stats[k] += s
            else:
                self.stats[k].mul_(self.beta).add_(s, alpha=1 - self.beta)

    def get(self, k: str) -> torch.Tensor:
        s = self.stats[k]
        if self.beta is None or self.steps == 0:
            return s
        return s / (1 - self.beta ** self.steps)


def _shapes(params) -> dict[str, tuple[int, ...]]:
    if isinstance(params, nn.Module):
        params = dict(params.named_parameters())
    if isinstance(params, Mapping):
        items = params.items()
    else:
        items = list(params)
    return {n: tuple(t.shape) if hasattr(t, "shape") else tuple(t) for n, t in items}


def _dense_from_matvec(matvec, shapes: dict[str, tuple[int, ...]]) -> torch.Tensor:
    names = list(shapes)
    sizes = [math.prod(s) for s in shapes.values()]
    eye = torch.eye(sum(sizes), dtype=torch.float64)
    cols = eye.split(sizes, dim=1)
    basis = {n: c.reshape(-1, *shapes[n]) for n, c in zip(names, cols)}
    out = torch.func.vmap(matvec)(basis)
    return torch.cat([out[n].reshape(eye.shape[0], -1) for n in names], dim=1).T


class Identity:
    """H_hat = I on the given parameters ({name: tensor or shape}, or a module)."""

    def __init__(self, params) -> None:
        self.shapes = _shapes(params)
        self.param_names = list(self.shapes)

    def update(self, grads: Tensors) -> None:
        """Nothing to accumulate (kept so every estimator takes the same stream)."""

    def matvec(self, v: Tensors) -> dict[str, torch.Tensor]:
        return {n: v[n] for n in self.param_names}

    def power(self, p: float, damping: float = 0.0) -> Identity:
        return self

    def dense(self) -> torch.Tensor:
        return torch.eye(sum(math.prod(s) for s in self.shapes.values()), dtype=torch.float64)

    def factor_entries(self) -> int:
        return 0


class Diagonal:
    """Adam's diagonal: H_hat = diag(sqrt(v)), v = bias-corrected EMA (beta) of g^2."""

    def __init__(self, params, beta: float | None = 0.999) -> None:
        self.shapes = _shapes(params)
        self.param_names = list(self.shapes)
        self.acc = _Accumulator(beta)
        self._diag: dict[str, torch.Tensor] | None = None

    def update(self, grads: Tensors) -> None:
        self.acc.add({n: grads[n].double() ** 2 for n in self.param_names})

    def diagonal(self) -> dict[str, torch.Tensor]:
        if self._diag is not None:
            return self._diag
        return {n: self.acc.get(n).sqrt() for n in self.param_names}

    def matvec(self, v: Tensors) -> dict[str, torch.Tensor]:
        d = self.diagonal()
        return {n: d[n].to(v[n].dtype) * v[n] for n in self.param_names}

    def power(self, p: float, damping: float = 0.0) -> Diagonal:
        d = self.diagonal()
        lam = max(float(t.max()) for t in d.values())
        out = Diagonal(self.shapes, self.acc.beta)
        tol = lam * 8 * math.sqrt(sum(t.numel() for t in d.values())) * torch.finfo(torch.float64).eps
        out._diag = {n: torch.where(t > tol, (t + damping * lam).pow(p), torch.zeros_like(t)) if p < 0
                     else (t + damping * lam).pow(p) for n, t in d.items()}
        return out

    def dense(self) -> torch.Tensor:
        d = self.diagonal()
        return torch.diag(torch.cat([d[n].reshape(-1) for n in self.param_names]))

    def factor_entries(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())


class Shampoo:
    """Two-sided Shampoo curvature: H ~ L^{1/4} (x) R^{1/4} per matrix, L^{1/2} per vector."""

    def __init__(self, params, beta: float | None = None) -> None:
        self.shapes = _shapes(params)
        self.param_names = list(self.shapes)
        self.acc = _Accumulator(beta)
        self._factors: dict[str, tuple[torch.Tensor, torch.Tensor | None]] | None = None

    def update(self, grads: Tensors) -> None:
        stats = {}
        for n in self.param_names:
            g = grads[n].detach().double()
            if g.ndim == 1:
                stats[n + ":L"] = torch.outer(g, g)
            else:
                g = g.reshape(g.shape[0], -1)
                stats[n + ":L"] = g @ g.T
                stats[n + ":R"] = g.T @ g
        self.acc.add(stats)

    def factors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """{name: (left, right)} of H itself: (L^{1/4}, R^{1/4}) for matrices, (L^{1/2}, None) for vectors."""
        if self._factors is not None:
            return self._factors
        return self._powered(1.0, 0.0)._factors

    def _powered(self, p: float, damping: float) -> Shampoo:
        out = Shampoo(self.shapes, self.acc.beta)
        fs = {}
        for n, shape in self.shapes.items():
            if self._factors is None:
                left = self.acc.get(n + ":L")
                if len(shape) == 1:
                    fs[n] = (sym_power(left, 0.5 * p, damping), None)
                else:
                    fs[n] = (sym_power(left, 0.25 * p, damping), sym_power(self.acc.get(n + ":R"), 0.25 * p, damping))
            else:  # powers of an already-powered estimate: powers of its factors
                left, right = self._factors[n]
                fs[n] = (sym_power(left, p, damping), None if right is None else sym_power(right, p, damping))
        out._factors = fs
        return out

    def matvec(self, v: Tensors) -> dict[str, torch.Tensor]:
        out = {}
        for n, (left, right) in self.factors().items():
            x = v[n]
            if right is None:
                out[n] = (left.to(x.dtype) @ x.reshape(-1)).reshape(x.shape)
            else:
                m = x.reshape(self.shapes[n][0], -1)
                out[n] = (left.to(x.dtype) @ m @ right.to(x.dtype)).reshape(x.shape)
        return out

    def power(self, p: float, damping: float = 0.0) -> Shampoo:
        """H^p: the factors' powers, each damped relative to its own largest eigenvalue."""
        return self._powered(p, damping)

    def dense(self) -> torch.Tensor:
        return _dense_from_matvec(self.matvec, self.shapes)

    def factor_entries(self) -> int:
        total = 0
        for s in self.shapes.values():
            total += s[0] ** 2 + (0 if len(s) == 1 else math.prod(s[1:]) ** 2)
        return total


class KFAC:
    """K-FAC for the `nn.Linear` layers of `model`: H ~ G (x) A per layer (weight and bias together).

    `KFAC(model)` registers hooks that record each layer's input and output gradient during a
    forward/backward pass; call `update()` after `backward()` to fold them into A and G. Without
    hooks (`hooks=False`), pass them yourself: `update(inputs={layer: a}, output_grads={layer: d})`,
    where d is the gradient of the (batch-mean) loss with respect to the layer's output.
    """

    def __init__(self, model: nn.Module, beta: float | None = 0.95, hooks: bool = True) -> None:
        self.layers = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        if not self.layers:
            raise ValueError("KFAC: the model has no nn.Linear layers")
        self.shapes: dict[str, tuple[int, ...]] = {}
        for n, m in self.layers.items():
            prefix = f"{n}." if n else ""
            self.shapes[prefix + "weight"] = tuple(m.weight.shape)
            if m.bias is not None:
                self.shapes[prefix + "bias"] = tuple(m.bias.shape)
        self.param_names = list(self.shapes)
        self.acc = _Accumulator(beta)
        self._inputs: dict[str, torch.Tensor] = {}
        self._grads: dict[str, torch.Tensor] = {}
        self._factors: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        self._handles = []
        if hooks:
            for n, m in self.layers.items():
                self._handles.append(m.register_forward_hook(self._record(n)))
        self.recording = True
        """Record layer inputs and output gradients in forward/backward passes (off: the hooks do nothing)."""

    def _record(self, name: str):
        # a tensor hook on the output, not a module backward hook: module backward hooks break torch.func
        def save_grad(grad):
            self._grads[name] = grad.detach()

        def hook(module, inputs, output):
            if not self.recording or torch._C._functorch.is_functorch_wrapped_tensor(output):
                return
            self._inputs[name] = inputs[0].detach()
            if output.requires_grad:
                output.register_hook(save_grad)
        return hook

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def update(self, grads: Tensors | None = None, *, inputs: Tensors | None = None,
               output_grads: Tensors | None = None) -> None:
        """Fold the last recorded (or the given) layer inputs and output gradients into A and G.

        `grads` is accepted and ignored, so every estimator takes the same call."""
        inputs = self._inputs if inputs is None else inputs
        output_grads = self._grads if output_grads is None else output_grads
        stats = {}
        for n, m in self.layers.items():
            if n not in inputs or n not in output_grads:
                raise ValueError(f"KFAC: no recorded input / output gradient for layer {n!r}; run forward and "
                                 "backward on the model before update()")
            a = inputs[n].double().reshape(-1, m.in_features)
            d = output_grads[n].double().reshape(-1, m.out_features)
            batch = a.shape[0]
            if m.bias is not None:
                a = torch.cat([a, torch.ones(batch, 1, dtype=a.dtype)], dim=1)
            stats[n + ":A"] = a.T @ a / batch
            # d_i = (1/B) dl_i/ds_i for a batch-mean loss: E[(B d_i)(B d_i)^T] = B sum d_i d_i^T
            stats[n + ":G"] = batch * (d.T @ d)
        self.acc.add(stats)
        self._inputs, self._grads = {}, {}

    def factors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{layer: (G, A)} of H itself."""
        if self._factors is not None:
            return self._factors
        return {n: (self.acc.get(n + ":G"), self.acc.get(n + ":A")) for n in self.layers}

    def power(self, p: float, damping: float = 0.0) -> KFAC:
        """H^p = G^p (x) A^p, each factor damped relative to its own largest eigenvalue."""
        out = KFAC.__new__(KFAC)
        out.layers, out.shapes, out.param_names, out.acc = self.layers, self.shapes, self.param_names, self.acc
        out._inputs, out._grads, out._handles, out.recording = {}, {}, [], False
        out._factors = {n: (sym_power(g, p, damping), sym_power(a, p, damping)) for n, (g, a) in self.factors().items()}
        return out

    def matvec(self, v: Tensors) -> dict[str, torch.Tensor]:
        out = {}
        for n, (g, a) in self.factors().items():
            m = self.layers[n]
            prefix = f"{n}." if n else ""
            w = v[prefix + "weight"]
            parts = [w]
            if m.bias is not None:
                parts.append(v[prefix + "bias"].unsqueeze(-1))
            x = torch.cat(parts, dim=-1)  # (..., out, in [+1])
            y = g.to(x.dtype) @ x @ a.to(x.dtype)
            out[prefix + "weight"] = y[..., :m.in_features]
            if m.bias is not None:
                out[prefix + "bias"] = y[..., m.in_features]
        return out

    def dense(self) -> torch.Tensor:
        return _dense_from_matvec(self.matvec, self.shapes)

    def factor_entries(self) -> int:
        return sum(m.out_features ** 2 + (m.in_features + (m.bias is not None)) ** 2 for m in self.layers.values())


__all__ = ["KFAC", "Diagonal", "Identity", "Shampoo"]
