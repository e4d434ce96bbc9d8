"""Recurrent models whose parameter names the RNN specs describe (specs/rnn_*.toml).

`RNN`: h_t = act(W_ih x_t + W_hh h_{t-1} + b_h), y = W_hy h_T + b_y. Permuting hidden units (perm)
is a true symmetry for every elementwise activation, permuting and flipping signs (signed_perm) for
odd ones such as tanh; W_hh moves as P W_hh P^T, so the hidden space occurs twice (a repeated space,
docs/repeated_spaces.md).
`TiedRNN`: a language model whose embedding E (vocab x hidden) is both the input lookup and the
output layer (logits = h_t E^T + b_y).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def _init(*shape: int, fan_in: int) -> nn.Parameter:
    bound = 1 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))


class RNN(nn.Module):
    """Elman RNN over (batch, time, d_in) inputs; returns the readout of the last hidden state, or of
    every state with `all_steps=True` ((batch, time, d_out))."""

    def __init__(self, d_in: int = 2, hidden: int = 32, d_out: int = 1, act: str = "tanh") -> None:
        super().__init__()
        self.act = {"tanh": torch.tanh, "relu": F.relu}[act]
        self.W_ih = _init(hidden, d_in, fan_in=d_in)
        self.W_hh = nn.Parameter(torch.nn.init.orthogonal_(torch.empty(hidden, hidden)))
        self.b_h = nn.Parameter(torch.zeros(hidden))
        self.W_hy = _init(d_out, hidden, fan_in=hidden)
        self.b_y = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: torch.Tensor, all_steps: bool = False) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], self.W_hh.shape[0])
        drive = x @ self.W_ih.T + self.b_h  # the input terms of every step at once
        states = []
        for t in range(x.shape[1]):
            h = self.act(drive[:, t] + h @ self.W_hh.T)
            states.append(h)
        if all_steps:
            return torch.stack(states, dim=1) @ self.W_hy.T + self.b_y
        return h @ self.W_hy.T + self.b_y


class TiedRNN(nn.Module):
    """Token-level tanh RNN language model with tied input/output embedding E (vocab x hidden)."""

    def __init__(self, vocab: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.E = nn.Parameter(0.3 * torch.randn(vocab, hidden))
        self.W_hh = nn.Parameter(torch.nn.init.orthogonal_(torch.empty(hidden, hidden)))
        self.b_h = nn.Parameter(torch.zeros(hidden))
        self.b_y = nn.Parameter(torch.zeros(vocab))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch, time) -> logits (batch, time, vocab) for the next token."""
        h = self.E.new_zeros(tokens.shape[0], self.W_hh.shape[0])
        inputs = self.E[tokens]
        out = []
        for t in range(tokens.shape[1]):
            h = torch.tanh(inputs[:, t] + h @ self.W_hh.T + self.b_h)
            out.append(h @ self.E.T + self.b_y)
        return torch.stack(out, dim=1)
