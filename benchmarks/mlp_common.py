"""Shared pieces of the curvature benchmarks (hessian_cosine.py, train_mlp.py): MLPs, their specs, data.

Spec variants for an MLP with layers fc1..fcL (hidden spaces h1..h{L-1}):
- "true":  every hidden space carries the network's group (signed_perm for tanh, perm for ReLU,
           orthogonal for linear); W_i rows, b_i and W_{i+1} columns share h_i (a true symmetry).
- "inner": the paper's smaller group, restricted to the inner layers: the first hidden space h1
           (fed by the input layer) carries no group, the others keep it. A subgroup of "true", so
           its commutant is larger: more factor entries, a finer estimate.
- "muon":  a private row space per layer (weight rows and that layer's bias), columns free: the
           Muon-style per-matrix group (relaxed, not a symmetry of the loss).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from symo.train.models import MLP

GROUP_OF_ACT = {"tanh": "signed_perm", "relu": "perm", "linear": "orthogonal"}


def make_mlp(sizes: tuple[int, ...], act: str, seed: int, dtype: torch.dtype = torch.float64) -> MLP:
    torch.manual_seed(seed)
    model = MLP(sizes, act="tanh" if act == "linear" else act)
    if act == "linear":
        model.act = lambda x: x  # a deep linear network: O(h) (indeed GL(h)) per hidden space is exact
    return model.to(dtype)


def mlp_spec_toml(n_layers: int, group: str, variant: str) -> str:
    """TOML text of a spec for symo.models.MLP with `n_layers` Linear layers (see the module docstring)."""
    lines = [f'name = "MLP {variant} ({group})"', "", "[spaces]"]
    params = []
    if variant == "muon":
        for i in range(1, n_layers + 1):
            lines.append(f'r{i} = {{ group = "signed_perm" }}')
            params += [f'"fc{i}.weight" = ["r{i}", "_"]', f'"fc{i}.bias" = ["r{i}"]']
    elif variant in ("true", "inner"):
        first = 2 if variant == "inner" else 1
        hidden = {i: (f"h{i}" if i >= first else "_") for i in range(1, n_layers)}
        for i in range(first, n_layers):
            lines.append(f'h{i} = {{ group = "{group}" }}')
        for i in range(1, n_layers + 1):
            rows = hidden.get(i, "_")
            cols = hidden.get(i - 1, "_")
            params += [f'"fc{i}.weight" = ["{rows}", "{cols}"]', f'"fc{i}.bias" = ["{rows}"]']
    else:
        raise ValueError(f"unknown spec variant {variant!r}: use true, inner or muon")
    return "\n".join(lines + ["", "[params]"] + params) + "\n"


def teacher_student(d_in: int, d_out: int, act: str, seed: int, n_train: int = 512, n_test: int = 1024,
                    teacher_hidden: tuple[int, ...] = (16, 16), noise: float = 0.01,
                    dtype: torch.dtype = torch.float64):
    """Gaussian inputs, targets from a random teacher MLP of the same activation (+ small noise)."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    teacher = make_mlp((d_in, *teacher_hidden, d_out), act, 20_000 + seed, dtype)
    with torch.no_grad():
        for p in teacher.parameters():  # larger weights than the default init: a non-trivial target
            p.mul_(2.0)
    x = torch.randn(n_train + n_test, d_in, generator=gen, dtype=dtype)
    with torch.no_grad():
        y = teacher(x)
        y = y / y.std() + noise * torch.randn(y.shape, generator=gen, dtype=dtype)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def digits(seed: int, n_train: int = 1000, dtype: torch.dtype = torch.float64):
    """scikit-learn's 8x8 digits (1797 images, 10 classes), pixels / 16, a seeded train/test split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.as_tensor(data.data, dtype=dtype) / 16.0
    y = torch.as_tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(30_000 + seed))
    x, y = x[perm], y[perm]
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((out - y) ** 2).sum(dim=-1).mean()


def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y)


def fmt(mean: float | None, std: float | None = None, digits_: int = 3) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    return f"{mean:.{digits_}f}" if std is None else f"{mean:.{digits_}f}±{std:.{digits_}f}"
