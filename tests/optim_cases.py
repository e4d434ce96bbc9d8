"""The specs, the regression problem and the loops the optimizer's tests share (test_optim.py,
test_optim_torch_api.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from symo.optim import Symo
from symo.train.models import MLP

SPECS = Path(__file__).resolve().parent.parent / "specs"
MUON, ROWS, COLS = SPECS / "muon.toml", SPECS / "shampoo_rows.toml", SPECS / "shampoo_cols.toml"
FACTORED, HIDDEN = SPECS / "factored.toml", SPECS / "hidden_hidden.toml"


def regression(model: torch.nn.Module, dtype: torch.dtype = torch.float64, seed: int = 1):
    """A fixed least-squares loss for a 3-layer MLP with 8 inputs."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 8, generator=gen, dtype=dtype)
    y = torch.randn(32, model.fc3.out_features, generator=gen, dtype=dtype)
    return lambda: ((model(x) - y) ** 2).mean()


def train(model, opts, loss_fn, steps: int) -> None:
    for _ in range(steps):
        for o in opts:
            o.zero_grad()
        loss_fn().backward()
        for o in opts:
            o.step()


def one_step_update(model, opt, loss_fn) -> dict[str, torch.Tensor]:
    """-(w_1 - w_0) / lr for every parameter (one step, lr from the first group)."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, [opt], loss_fn, 1)
    lr = opt.param_groups[0]["lr"]
    return {n: (before[n] - p.detach()) / lr for n, p in model.named_parameters()}


def first_update(spec, **options) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Gradients and the first update of a float64 MLP, no momentum or damping."""
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4)).double()
    loss_fn = regression(model)
    loss_fn().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    opt = Symo(model.named_parameters(), spec, lr=0.1, beta1=0.0, damping=0.0, **options)
    return grads, one_step_update(model, opt, loss_fn)
