"""The bundled spec gpt_muon_qkv_mlp: gpt_muon_qkv's attention, each MLP's c_fc and c_proj one block through their
hidden units.

Oracles: the float64 SVD's polar factor of the stacked gradient [G_fc | G_proj^T] (Muon's first step), and
pytorch-optimizer's SOAP run on one h x 2d tensor fed that stacked gradient (SOAP-Muon's direction, before the first
refresh); each matrix's part then has Muon's per-shape RMS, 1 / sqrt(fan_in), written out here.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import F64, muons_first_step_on_gpt, polar, rel

import symo
from symo.train import TrainConfig
from symo.train.models import GPT, GPTConfig
from symo.train.optimizers import build_optimizer

# one MLP's two matrices as the spec couples them: fc (h x d) rows and proj (d x h) columns share the hidden space
COUPLED = '[spaces]\nmlp = "signed_perm"\n[params]\nfc = ["mlp", "_"]\nproj = ["_", "mlp"]\n'
SOAP_MUON = {"preset": "soap_muon", "stats_dtype": "float64", "nesterov": False}


def at_muons_rms(direction: torch.Tensor) -> torch.Tensor:
    """`direction` rescaled to the RMS Muon's polar factor gives a full-rank matrix of its shape: 1 / sqrt(cols)."""
    return direction / direction.norm() * math.sqrt(direction.numel() / direction.shape[1])


def stacked(g_fc: torch.Tensor, g_proj: torch.Tensor) -> torch.Tensor:
    """The MLP's block as a hidden unit sees it: its c_fc row beside its c_proj column (h x 2d)."""
    return torch.cat([g_fc, g_proj.T], dim=1)


def test_symo_train_builds_it_with_each_mlp_one_block():
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8))
    cfg = TrainConfig(spec="gpt_muon_qkv_mlp", optimizer="symo", n_layer=2, n_head=2, n_embd=8, block_size=8)
    described = " ".join(build_optimizer(model, cfg).describe().split())  # describe() wraps its lines
    for i in range(2):
        assert f"per qkv{i}: Y 3x8x8" in described
        assert (f"nat(mlp{i}): Y 1x16x32, d=32" in described and
                f"transformer.h.{i}.mlp.c_fc.weight, transformer.h.{i}.mlp.c_proj.weight" in described)


def test_muons_step_moves_the_mlp_by_the_polar_factor_of_its_stacked_gradient():
    """Muon's first step (momentum and damping off, exact polar factor): c_fc and c_proj move by the two parts of the
    polar factor of [G_fc | G_proj^T], each at Muon's per-shape RMS; that is not either matrix's own polar factor.
    The attention's matrices move as under gpt_muon_qkv."""
    grads, moved = muons_first_step_on_gpt("gpt_muon_qkv_mlp")
    for i in range(2):
        fc, proj = f"transformer.h.{i}.mlp.c_fc.weight", f"transformer.h.{i}.mlp.c_proj.weight"
        p = polar(stacked(grads[fc], grads[proj]), tol=1e-10)
        assert rel(moved[fc], at_muons_rms(p[:, :8])) < 1e-8
        assert rel(moved[proj], at_muons_rms(p[:, 8:].T)) < 1e-8
        assert rel(moved[fc], at_muons_rms(polar(grads[fc], tol=1e-10))) > 0.05
        attn = f"transformer.h.{i}.attn.c_attn.weight"
        assert rel(moved[attn], torch.cat([polar(part, tol=1e-10) for part in grads[attn].split(8)])) < 1e-8


def test_soap_muon_on_the_coupled_mlp_is_the_polar_factor_of_soaps_direction_on_the_stacked_matrix():
    """SOAP-Muon on an MLP coupled through its hidden units: the first step moves nothing, and until the first
    refresh the two matrices move by the parts of lr polar(N) at Muon's per-shape RMS, N pytorch-optimizer's SOAP
    direction on one h x 2d tensor fed the stacked gradients. So the hidden-unit side's statistic sums c_fc's
    G G^T and c_proj's G^T G, and the other side mixes c_fc's inputs with c_proj's outputs."""
    pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
    torch.manual_seed(0)
    d, h, lr = 3, 7, 0.05
    fc = torch.nn.Parameter(torch.randn(h, d, dtype=F64))
    proj = torch.nn.Parameter(torch.randn(d, h, dtype=F64))
    twin = torch.nn.Parameter(stacked(fc.detach(), proj.detach()))
    opt = symo.Symo({"fc": fc, "proj": proj}, symo.parse_spec(COUPLED), lr=lr, backend="eigh",
                    precondition_frequency=10, **SOAP_MUON)
    lib = pytorch_optimizer.SOAP([twin], lr=1.0, weight_decay=0.0, precondition_frequency=10)
    x = torch.randn(16, d, dtype=F64)
    for t in range(8):
        fc.grad = proj.grad = None
        (torch.tanh(x @ fc.T) @ proj.T - x.flip(0)).pow(2).sum().backward()
        twin.grad = stacked(fc.grad, proj.grad)
        before, lib_before = (fc.detach().clone(), proj.detach().clone()), twin.detach().clone()
        opt.step()
        lib.step()
        if t == 0:
            assert torch.equal(before[0], fc.detach()) and torch.equal(before[1], proj.detach())
            continue
        p = polar(lib_before - twin.detach())
        assert rel(before[0] - fc.detach(), lr * at_muons_rms(p[:, :d])) < 1e-4, t
        assert rel(before[1] - proj.detach(), lr * at_muons_rms(p[:, d:].T)) < 1e-4, t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_the_dtypes_users_train_in(dtype):
    """float32 and bfloat16 on the GPT (whose MLP gradients are rank-deficient: LayerNorm centres c_fc's input),
    30 steps of SOAP-Muon with refreshes every 4: every parameter stays finite, and the MLP's matrices move."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8)).to(dtype)
    opt = symo.Symo(model.named_parameters(), "gpt_muon_qkv_mlp", preset="soap_muon", lr=0.02,
                    precondition_frequency=4)
    start = model.transformer.h[0].mlp.c_proj.weight.detach().clone()
    for _ in range(30):
        idx = torch.randint(0, 11, (3, 8))
        model(idx, idx)[1].backward()
        opt.step()
        opt.zero_grad()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not torch.equal(model.transformer.h[0].mlp.c_proj.weight.detach(), start)
