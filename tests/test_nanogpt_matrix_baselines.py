"""The nanoGPT campaign's library arms (benchmarks/nanogpt_matrix_runs.py): each is the library's own optimizer on
the hidden matrices, and NorMuon's Newton-Schulz runs in float32 as the Muon arm's does, with nothing else changed."""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import keep_newton_schulz, newton_schulz_modules

from benchmarks.nanogpt_matrix_runs import ARMS, Chained, build, newton_schulz_in_float32
from symo.train.models import GPT, GPTConfig

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")


def one_step(patched: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, torch.Tensor]:
    """NorMuon's first update of a 64 x 48 matrix (the library's own step), and the iteration's output dtype."""
    keep_newton_schulz(monkeypatch, pytorch_optimizer.NorMuon)
    if patched:
        newton_schulz_in_float32(pytorch_optimizer.NorMuon)
    torch.manual_seed(0)
    w = torch.randn(64, 48, requires_grad=True)
    w.grad = torch.randn(64, 48)
    before = w.detach().clone()
    pytorch_optimizer.NorMuon([{"params": [w], "use_muon": True}], lr=0.02).step()
    module = newton_schulz_modules(pytorch_optimizer.NorMuon)[0]
    dtype = module.zero_power_via_newton_schulz_5(torch.randn(8, 4), num_steps=1).dtype
    return w.detach() - before, dtype


def test_normuon_arm_runs_the_librarys_step_with_its_iteration_in_float32(monkeypatch):
    """Patched, the iteration returns float32 and the update is the library's to bfloat16's rounding: the same
    step, in the Muon arm's precision. The patch is idempotent (a second build wraps nothing twice)."""
    library, library_dtype = one_step(False, monkeypatch)
    ours, ours_dtype = one_step(True, monkeypatch)
    assert library_dtype == torch.bfloat16 and ours_dtype == torch.float32
    rel = float((ours - library).norm() / library.norm())
    assert 1e-5 < rel < 2e-2, rel  # different arithmetic, the same step
    newton_schulz_in_float32(pytorch_optimizer.NorMuon)
    for module in newton_schulz_modules(pytorch_optimizer.NorMuon):
        iteration = module.zero_power_via_newton_schulz_5
        assert isinstance(iteration, functools.partial) and not isinstance(iteration.func, functools.partial)


def test_the_library_arms_build_the_librarys_class_on_the_hidden_matrices_and_adamw_on_the_rest(monkeypatch):
    keep_newton_schulz(monkeypatch, pytorch_optimizer.NorMuon)
    model = GPT(GPTConfig(block_size=8, vocab_size=5, n_layer=1, n_head=2, n_embd=16))
    for arm, cls in (("normuon", "NorMuon"), ("soap_authors", "SOAP")):
        opt = build(ARMS[arm], model, lr=0.02, wd=0.1, adamw_lr=3e-3, n_embd=16, n_head=2)
        assert isinstance(opt, Chained)
        library, adamw = opt.optimizers
        assert type(library).__name__ == cls and isinstance(adamw, torch.optim.AdamW)
        hidden = {id(p) for g in library.param_groups for p in g["params"]}
        assert {id(p) for g in adamw.param_groups for p in g["params"]}.isdisjoint(hidden)
        assert all(p.ndim == 2 for g in library.param_groups for p in g["params"])
        assert all(g["lr"] == 0.02 and g["weight_decay"] == 0.1 for g in library.param_groups)
        assert len(hidden) + sum(len(g["params"]) for g in adamw.param_groups) == len(list(model.parameters()))
