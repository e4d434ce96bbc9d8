"""A small transformer and its task: next-token prediction of a noisy recurrence, trained in seconds on a CPU.

The model: token and position embeddings, two pre-LayerNorm blocks of `nn.MultiheadAttention` (whose query,
key and value live in one fused `in_proj_weight`) and a GELU MLP, a linear head; d_model 32, 2 heads. The task:
x_t = (x_{t-1} + 3 x_{t-2}) mod 16, replaced by a uniform token with probability 0.1, so the loss on the
predictable positions has a floor of 0.565 nats. The one-line start's tests (`symo.Symo(model)`) and
benchmarks/fused_pieces.py train it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, T, D, HEADS, LAYERS = 16, 16, 32, 2, 2
STEPS, BATCH = 300, 32
NOISE = 0.1


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(D)
        self.fc = nn.Linear(D, 4 * D)
        self.proj = nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(0.02 * torch.randn(T, D))
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), 1)
        x = self.emb(idx) + self.pos[:t]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def sequences(n: int, gen: torch.Generator, noise: float = NOISE) -> torch.Tensor:
    """n sequences of T + 1 tokens of the noisy recurrence."""
    x = torch.empty(n, T + 1, dtype=torch.long)
    x[:, :2] = torch.randint(0, VOCAB, (n, 2), generator=gen)
    for t in range(2, T + 1):
        rule = (x[:, t - 1] + 3 * x[:, t - 2]) % VOCAB
        uniform = torch.randint(0, VOCAB, (n,), generator=gen)
        x[:, t] = torch.where(torch.rand(n, generator=gen) < noise, uniform, rule)
    return x


def next_token_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    logits = model(x[:, :-1])  # positions 1.. are predictable from the two tokens before them
    return F.cross_entropy(logits[:, 1:].reshape(-1, VOCAB), x[:, 2:].reshape(-1))


def train_recurrence(make_opt: Callable[[nn.Module], torch.optim.Optimizer], seed: int = 0,
                     steps: int = STEPS) -> float:
    """Validation loss (512 held-out sequences) after `steps` steps of batch BATCH. Seed 0 is the tests' run;
    each seed draws its own initialization and batches, the same for every optimizer."""
    torch.manual_seed(seed)
    model = TinyTransformer()
    opt = make_opt(model)
    gen = torch.Generator().manual_seed(1 + 1000 * seed)
    for _ in range(steps):
        loss = next_token_loss(model, sequences(BATCH, gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return next_token_loss(model, sequences(512, torch.Generator().manual_seed(2))).item()
