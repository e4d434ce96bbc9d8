"""A small model zoo whose parameter names the bundled specs describe.

`GPT` follows nanoGPT (Karpathy) closely, so specs/gpt.toml also covers nanoGPT checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    """fc1 -> act -> fc2 -> act -> ... ; names fc1, fc2, ... as the MLP specs expect."""

    def __init__(self, sizes: tuple[int, ...] = (8, 16, 16, 4), act: str = "tanh", bias: bool = True) -> None:
        super().__init__()
        self.act = {"tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu}[act]
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
            setattr(self, f"fc{i}", nn.Linear(a, b, bias=bias))
        self.depth = len(sizes) - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(1, self.depth + 1):
            x = getattr(self, f"fc{i}")(x)
            if i < self.depth:
                x = self.act(x)
        return x


class Factored(nn.Module):
    """W = U V^T (matrix sensing / completion): the O(k) gauge (U, V) -> (U Q, V Q) is exact."""

    def __init__(self, m: int = 10, n: int = 8, k: int = 3, scale: float = 0.3) -> None:
        super().__init__()
        self.U = nn.Parameter(scale * torch.randn(m, k))
        self.V = nn.Parameter(scale * torch.randn(n, k))

    def forward(self) -> torch.Tensor:
        return self.U @ self.V.T


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 65
    n_layer: int = 4
    n_head: int = 2
    n_embd: int = 128
    bias: bool = True
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.n_head = cfg.n_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias),
                                      c_proj=nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        h = self.ln_2(x)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(h)))


class GPT(nn.Module):
    """nanoGPT's GPT-2 shaped model with tied embeddings."""

    def __init__(self, cfg: GPTConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = cfg or GPTConfig(**overrides)
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias)))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in nanoGPT
        self.apply(self._init)
        for n, p in self.named_parameters():
            if n.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def gpt_small() -> GPT:
    """4 layers, 2 heads of 64, d_model 128, vocabulary 65: the shapes the docs' CLI examples compile for (`symo
    train`'s own model has 4 heads of 32 and the vocabulary of its corpus)."""
    return GPT(GPTConfig())


def gpt2_124m() -> GPT:
    """12 layers, 12 heads, d_model 768 (GPT-2 small shapes, for compile checks and the CLI)."""
    return GPT(GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768))


def gpt_bench() -> GPT:
    """6 layers, d_model 384, vocabulary 65: the step-overhead benchmark's shapes."""
    return GPT(GPTConfig(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384))


def mlp_tanh() -> MLP:
    return MLP((8, 16, 16, 4), act="tanh")


def mlp_relu() -> MLP:
    return MLP((8, 16, 16, 4), act="relu")


def factored() -> Factored:
    return Factored()
