"""A small attention block and its whole symmetry spec (heads permuted as wholes, each head carrying its own O(d_head)
on its query/key and value/output bases), shared by the tests of heads permuted as wholes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

D, HEADS, D_HEAD, MLP = 8, 3, 2, 6


class Attention(nn.Module):
    """One pre-norm-free transformer block: causal multi-head attention (q, k, v, o projections) and a ReLU
    MLP, each on a residual. `k_major`: the key projection stores its rows d_head-major, (d_head head), where
    the others store (head d_head); `mix`: a hidden-to-hidden layer `r` inside the MLP (its space repeats)."""

    def __init__(self, d: int = D, heads: int = HEADS, d_head: int = D_HEAD, mlp: int = MLP,
                 k_major: bool = False, mix: bool = False) -> None:
        super().__init__()
        self.heads, self.d_head, self.k_major = heads, d_head, k_major
        self.q, self.k, self.v = (nn.Linear(d, heads * d_head) for _ in range(3))
        self.o = nn.Linear(heads * d_head, d)
        self.fc1, self.fc2 = nn.Linear(d, mlp), nn.Linear(mlp, d)
        self.r = nn.Linear(mlp, mlp, bias=False) if mix else None  # hidden -> hidden: the MLP space twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def split(z: torch.Tensor) -> torch.Tensor:  # (b, t, heads * d_head) -> (b, heads, t, d_head)
            return z.view(b, t, self.heads, self.d_head).transpose(1, 2)

        k = self.k(x)
        k = k.view(b, t, self.d_head, self.heads).transpose(2, 3).transpose(1, 2) if self.k_major else split(k)
        y = F.scaled_dot_product_attention(split(self.q(x)), k, split(self.v(x)), is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        h = torch.relu(self.fc1(x))
        return x + self.fc2(h if self.r is None else torch.relu(self.r(h)))


def spec_text(owner: str = "perm", k_rows: str = "(head dqk)", o_cols: str = "(head dvo)") -> str:
    return f'''name = "attention, heads {owner}"

[spaces]
head = {{ group = "{owner}" }}
dqk  = {{ group = "orthogonal", per = "head", size = {D_HEAD} }}
dvo  = {{ group = "orthogonal", per = "head", size = {D_HEAD} }}
mlp  = {{ group = "perm" }}

[params]
"q.weight"   = ["(head dqk)", "_"]
"q.bias"     = ["(head dqk)"]
"k.weight"   = ["{k_rows}", "_"]
"k.bias"     = ["{k_rows}"]
"v.weight"   = ["(head dvo)", "_"]
"v.bias"     = ["(head dvo)"]
"o.weight"   = ["_", "{o_cols}"]
"fc1.weight" = ["mlp", "_"]
"fc1.bias"   = ["mlp"]
"fc2.weight" = ["_", "mlp"]
'''


def attention(seed: int, **kwargs) -> Attention:
    torch.manual_seed(seed)
    return Attention(**kwargs).double()


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def inputs(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def output_loss(model: nn.Module, x: torch.Tensor):
    return lambda w: torch.func.functional_call(model, w, (x,)).pow(2).sum()
