"""The Hessian tool on attention models: `hessian.dense`, `hvp` and `compare` on models that call
`F.scaled_dot_product_attention`, whose fused CPU kernel has no second derivative (torch raises
NotImplementedError under forward-over-reverse). Oracles: central finite differences of the gradient
that plain autograd computes through the fused kernel, and torch.func.hessian of the same block with
attention written out by hand (softmax(q k^T / sqrt(d)) v). Tiny float64 models: seconds.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

import symo
from symo import hessian
from symo.train.models import GPT, GPTConfig


class UserAttention(nn.Module):
    """A user's own multi-head attention block: fused qkv, F.scaled_dot_product_attention with a
    padding mask, an output projection and a tanh MLP. `manual=True` writes attention out by hand."""

    def __init__(self, d: int = 4, heads: int = 2, manual: bool = False) -> None:
        super().__init__()
        self.heads, self.manual = heads, manual
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.mlp = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        if self.manual:
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            y = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return x + torch.tanh(self.mlp(x))


def tiny_gpt() -> tuple[GPT, dict[str, torch.Tensor], callable]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=4, vocab_size=5, n_layer=1, n_head=2, n_embd=4)).double()
    gen = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, 5, (2, 4), generator=gen), torch.randint(0, 5, (2, 4), generator=gen)
    # named_parameters() lists the tied embedding once (as transformer.wte.weight)
    params = {n: p.detach().clone() + 0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype)
              for n, p in model.named_parameters()}

    def loss_fn(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(model, p, (idx, targets))[1]

    return model, params, loss_fn


def finite_difference_hessian(loss_fn, params: dict[str, torch.Tensor], eps: float = 1e-5) -> torch.Tensor:
    """Central differences of the autograd gradient (first order only: the fused kernel's own backward)."""
    names = list(params)
    w0 = hessian.flatten(params, names)

    def grad(w: torch.Tensor) -> torch.Tensor:
        p = {n: t.requires_grad_() for n, t in hessian.unflatten(w.clone(), params).items()}
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss_fn(p), list(p.values()))])

    cols = [(grad(w0 + eps * e) - grad(w0 - eps * e)) / (2 * eps) for e in torch.eye(len(w0), dtype=w0.dtype)]
    fd = torch.stack(cols)
    return (fd + fd.T) / 2


def test_dense_hvp_and_compare_work_on_the_bundled_gpt():
    model, params, loss_fn = tiny_gpt()
    h = hessian.dense(loss_fn, params)
    assert torch.allclose(h, finite_difference_hessian(loss_fn, params), atol=1e-6, rtol=0)
    gen = torch.Generator().manual_seed(2)
    v = {n: torch.randn(t.shape, generator=gen, dtype=t.dtype) for n, t in params.items()}
    hv = hessian.flatten(hessian.hvp(loss_fn, params, v), list(params))
    assert torch.allclose(hv, h @ hessian.flatten(v, list(params)), atol=1e-10)
    # the whole tool: Symo's estimate for the spec of the bundled GPT scored against the truth
    compiled = symo.compile("gpt_muon", model, disk_cache=False)
    covered = {n: params[n] for n in compiled.param_names}
    g = hessian.gradient(loss_fn, params)
    estimate = compiled.orbit_average({n: g[n] for n in covered}).power(0.5)

    def covered_loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return loss_fn({**params, **p})

    metrics = hessian.compare(estimate, covered_loss, covered, damping=1e-3, random_directions=2)
    assert all(math.isfinite(m) and -1 <= m <= 1 for m in metrics.values()), metrics


def test_dense_on_a_user_block_equals_attention_written_out():
    torch.manual_seed(0)
    fused, manual = UserAttention().double(), UserAttention(manual=True).double()
    manual.load_state_dict(fused.state_dict())
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[True, False, True], [True, True, False], [False, True, True]])
    params = {n: p.detach() for n, p in fused.named_parameters()}

    def loss(model: nn.Module):
        return lambda p: (torch.func.functional_call(model, p, (x, mask)) ** 2).mean()

    reference = torch.func.hessian(lambda w: loss(manual)(hessian.unflatten(w, params)))(
        hessian.flatten(params, list(params)))
    assert torch.allclose(hessian.dense(loss(fused), params), reference, atol=1e-12, rtol=0)


def test_a_float32_model_given_part_of_its_parameters_gets_a_message_naming_the_fix():
    """A user's natural first call: a subset of a float32 model's parameters (the attention block), which
    dense casts to float64, meets the rest of the model in float32. The error says to use a float64 copy."""
    torch.manual_seed(0)
    model = UserAttention()
    x, mask = torch.randn(2, 3, 4), torch.ones(3, 3, dtype=torch.bool)
    qkv = {n: p for n, p in model.named_parameters() if n.startswith("qkv.")}

    def loss_fn(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(model, p, (x, mask)).square().mean()

    for tool in (hessian.dense, hessian.gradient):
        try:
            tool(loss_fn, qkv)
        except TypeError as exc:
            assert "float64 copy of the model" in str(exc) and "double()" in str(exc)
        else:
            raise AssertionError(f"{tool.__name__} accepted a float32 model with float64 parameters")
    double = {n: p.double() for n, p in qkv.items()}
    model64 = copy.deepcopy(model).double()
    h = hessian.dense(lambda p: torch.func.functional_call(model64, p, (x.double(), mask)).square().mean(), double)
    assert h.shape == (60, 60) and torch.isfinite(h).all()
