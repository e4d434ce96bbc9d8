"""K-FAC as a Hessian estimate for the `nn.Linear` layers of a model: H ~ G (x) A with A = E[a a^T] over
layer inputs (augmented by 1 for the bias) and G = E[d d^T] over per-sample gradients of the layer's
outputs (the empirical Fisher's Kronecker factors; weight and bias form one block)."""

from __future__ import annotations

import torch
from torch import nn

from ...runtime.linalg import sym_power
from .common import Tensors, _Accumulator, _dense_from_matvec


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


__all__ = ["KFAC"]
