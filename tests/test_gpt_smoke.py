"""End to end on the GPT specs: compile, a few optimizer steps, the loss goes down."""

from pathlib import Path

import pytest
import torch

import symo
from symo.train.models import GPT, GPTConfig

SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.mark.parametrize("spec,options", [
    ("gpt.toml", dict(lr=0.02, update_scale="muon")),
    ("gpt_muon.toml", dict(lr=0.02, update_scale="muon")),
    ("gpt.toml", dict(lr=3e-3, update_scale="adamw", preconditioner="root", beta2=0.95, precondition_frequency=2)),
])
def test_symo_trains_a_tiny_gpt(spec, options):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=17, block_size=16))
    data = torch.randint(0, 17, (8, 17))
    x, y = data[:, :-1], data[:, 1:]  # y is a non-contiguous slice, as in a real data loader
    opt = symo.Symo(model.named_parameters(), SPECS / spec, sizes={"dqk{i}": 16, "dvo{i}": 16}
                    if spec == "gpt.toml" else None, adamw_lr=3e-3, **options)
    assert {k for k in opt.assignment.values()} == {"symo", "adamw"}
    losses = []
    for _ in range(8):
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses
