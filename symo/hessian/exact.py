"""The true Hessian of a small model, by torch.func in float64: `dense` (P x P), `hvp` (without forming
it), `gradient`, and `flatten` / `unflatten` between {name: tensor} and the P-vector order of `dense`.

`loss_fn(params_dict) -> scalar` must accept float64 tensors (cast the data to the parameters' dtype
inside it).

Second derivatives run the forward under PyTorch's math attention (`second_order_attention`): the fused
`F.scaled_dot_product_attention` kernels (flash on CPU, flash and memory-efficient on GPUs) have neither
a forward-mode nor a double-backward derivative, and the math path computes the same function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

Tensors = Mapping[str, torch.Tensor]
LossFn = Callable[[dict[str, torch.Tensor]], torch.Tensor]


# ------------------------------------------------------------------ flattening
def _detached(params: Tensors, dtype: torch.dtype | None = torch.float64) -> dict[str, torch.Tensor]:
    if not params:
        raise ValueError("params is empty: pass {name: tensor} for every parameter the loss depends on")
    return {n: (p.detach().to(dtype) if dtype is not None else p.detach()) for n, p in params.items()}


@contextlib.contextmanager
def _float64_hint() -> Iterator[None]:
    """Turn the dtype mismatch of a loss that mixes the float64 parameters with float32 tensors (a float32
    model given a subset of its parameters) into a message saying what to change."""
    try:
        yield
    except RuntimeError as exc:
        if "dtype" not in str(exc) and "Double" not in str(exc):
            raise
        raise TypeError(
            f"loss_fn failed with the parameters in float64 ({exc}). The Hessian is taken in float64, so "
            "everything the loss combines with them must be float64 too: call the loss on a float64 copy of the "
            "model (copy.deepcopy(model).double() inside torch.func.functional_call) and cast the data to "
            "float64") from exc


def flatten(tensors: Tensors, names: list[str]) -> torch.Tensor:
    """Concatenate tensors in `names` order, each row-major (the order of `dense`)."""
    return torch.cat([tensors[n].reshape(-1) for n in names])


def unflatten(vec: torch.Tensor, like: Tensors) -> dict[str, torch.Tensor]:
    """The inverse of `flatten` for tensors shaped like `like` (its key order)."""
    out, i = {}, 0
    for n, t in like.items():
        out[n] = vec[i:i + t.numel()].reshape(t.shape)
        i += t.numel()
    if i != vec.numel():
        raise ValueError(f"vector of length {vec.numel()} does not match parameters of total size {i}")
    return out


# ------------------------------------------------------------------ the truth
@contextlib.contextmanager
def second_order_attention() -> Iterator[None]:
    """Run `F.scaled_dot_product_attention` through its math path, which has second derivatives.

    The fused kernels it picks by default raise NotImplementedError under forward-over-reverse (and
    double backward): "Trying to use forward AD with _scaled_dot_product_flash_attention_for_cpu". The
    math path is the textbook softmax(q k^T / sqrt(d) + mask) v, equal to them up to rounding.
    """
    with sdpa_kernel(SDPBackend.MATH):
        yield


def hvp(loss_fn: LossFn, params: Tensors, v: Tensors) -> dict[str, torch.Tensor]:
    """H v by forward-over-reverse differentiation, in the parameters' dtype; H is never formed."""
    p = _detached(params, None)
    missing = [n for n in p if n not in v]
    if missing:
        raise KeyError(f"hvp: v lacks tensors for parameters {missing}")
    tangent = {n: v[n].to(p[n].dtype) for n in p}
    with second_order_attention():
        _, out = torch.func.jvp(torch.func.grad(loss_fn), (p,), (tangent,))
    return {n: t.detach() for n, t in out.items()}  # numbers, though a live model's other parameters keep a graph


def gradient(loss_fn: LossFn, params: Tensors) -> dict[str, torch.Tensor]:
    """The gradient of `loss_fn` at `params` (float64)."""
    with _float64_hint():
        return {n: t.detach() for n, t in torch.func.grad(loss_fn)(_detached(params)).items()}


def dense(loss_fn: LossFn, params: Tensors, chunk_size: int = 256) -> torch.Tensor:
    """The P x P Hessian in float64, parameters in `params`' order, each tensor row-major.

    Built column by column as H e_i (vmapped forward-over-reverse, `chunk_size` columns at a time, so
    memory stays at chunk_size copies of the activations), then symmetrised.
    """
    p = _detached(params)
    names = list(p)
    sizes = [t.numel() for t in p.values()]
    total = sum(sizes)
    grad_fn = torch.func.grad(loss_fn)

    def column(e: torch.Tensor) -> torch.Tensor:
        tangent = unflatten(e, p)
        _, out = torch.func.jvp(grad_fn, (p,), (tangent,))
        return flatten(out, names)

    eye = torch.eye(total, dtype=torch.float64)
    with second_order_attention(), _float64_hint():
        h = torch.func.vmap(column, chunk_size=chunk_size)(eye).detach()
    return (h + h.T) / 2


__all__ = ["LossFn", "Tensors", "dense", "flatten", "gradient", "hvp", "second_order_attention", "unflatten"]
