"""Faults a fault-injection pass found in the optimizer, each with the behaviour the documentation promises:

- a finite gradient of ~1e25 (its float32 Gram overflows) gives a finite polar update, and later steps too;
- the shampoo preset's update is scale-invariant on a rank-deficient block (its epsilon no longer amplifies
  rounding noise by epsilon^-1/2);
- a state dict of another optimizer (torch.optim.AdamW) is refused with a message;
- a step that raises (a NaN with check_finite=False) changes nothing: weights, momentum, block statistics and
  the AdamW moments are as before, and the next good step is the step an untouched optimizer takes;
- the torch idiom of leaving frozen parameters out of the optimizer works (with a warning naming them).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from helpers import rel

import symo
from symo.optim import Symo
from symo.runtime.compiled import NonFiniteUpdateError
from symo.train.models import MLP

MUON = symo.load_spec("muon")


def snapshot(model: torch.nn.Module, opt: Symo) -> dict:
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "state": copy.deepcopy(opt.state_dict()["state"])}


def same(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def test_a_huge_finite_gradient_gives_a_finite_polar_update_now_and_later():
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4))
    opt = Symo(model.named_parameters(), MUON, lr=0.02)
    model.fc2.weight.grad = torch.randn(12, 16) * 1e25   # its float32 Gram (1e50) overflows
    opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    for _ in range(3):                                    # the momentum holds 1e25 and decays
        opt.zero_grad()
        model(torch.randn(4, 8)).square().sum().backward()
        before = model.fc2.weight.detach().clone()
        opt.step()
        step = (before - model.fc2.weight.detach()) / 0.02
        assert torch.isfinite(step).all() and float(step.norm()) < 10 * 16 ** 0.5   # sqrt(rows) U V^T: bounded


def test_shampoo_preset_update_is_scale_invariant_on_a_rank_deficient_block():
    """fc2 (12 x 16) under muon.toml: Y = G^T, statistic G^T G / 12 of rank <= 12 of 16. Shampoo's
    (S + eps)^{-1/2} G is scale-invariant once S dwarfs eps; rounding-noise eigenvalues at eps_64 lambda_max
    used to be damped by eps alone and amplified ~1e17x at scale 1e30."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(12, 16, generator=gen, dtype=torch.float64)
    updates = {}
    for scale in (1.0, 1e15, 1e20, 1e30):
        w = torch.nn.Parameter(torch.zeros(12, 16, dtype=torch.float64))
        opt = Symo({"fc2.weight": w}, MUON, preset="shampoo", lr=1.0)
        w.grad = g * scale
        opt.step()
        updates[scale] = -w.detach()
    for scale in (1e15, 1e20, 1e30):
        assert rel(updates[scale], updates[1.0]) < 1e-6, scale


def test_a_foreign_state_dict_is_refused_with_a_message():
    model = MLP((8, 16, 12, 4), bias=False)
    other = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).square().sum().backward()
    other.step()
    opt = Symo(model.named_parameters(), MUON)
    with pytest.raises(ValueError, match="not saved by Symo"):
        opt.load_state_dict(other.state_dict())


@pytest.mark.parametrize("preset", ["shampoo", "published", "notebook", "then_orthogonalize"])
def test_a_step_that_raises_changes_nothing(preset):
    """Kinds that decompose a statistic every step (then_orthogonalize: refreshed every step here) meet the NaN
    there. (With check_finite=False a NaN on a step without a decomposition reaches the weights.)"""
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4)).double()
    twin = copy.deepcopy(model)
    extra = {"precondition_frequency": 1} if preset == "then_orthogonalize" else {}
    make = lambda m: Symo(m.named_parameters(), symo.load_spec("mlp_tanh"), preset=preset,  # noqa: E731
                          lr=0.01, check_finite=False, **extra)
    opt, twin_opt = make(model), make(twin)
    x = torch.randn(8, 8, dtype=torch.float64)
    for m, o in ((model, opt), (twin, twin_opt)):
        for _ in range(2):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
    before = snapshot(model, opt)
    opt.zero_grad()
    model(x).square().sum().backward()
    model.fc1.weight.grad[0, 0] = float("nan")
    with pytest.raises(NonFiniteUpdateError, match=r"fc1.weight.*changed nothing"):
        opt.step()
    after = snapshot(model, opt)
    assert same(after["params"], before["params"]) and same(after["state"], before["state"])
    for m, o in ((model, opt), (twin, twin_opt)):   # the next good step is the untouched optimizer's step
        o.zero_grad()
        m(x).square().sum().backward()
        o.step()
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("preset", ["soap", "soap_muon", "eigen_adam"])
def test_a_statistic_that_overflows_float32_is_an_error_that_changes_nothing(preset):
    """Finite gradients of 1e20: their squares overflow the SOAP kinds' float32 statistics. The first step raises
    NonFiniteUpdateError naming the cure and writes nothing: the optimizer is still fresh, so its next step is a
    new optimizer's, bit for bit."""
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4))
    twin = copy.deepcopy(model)
    make = lambda m: Symo(m.named_parameters(), symo.load_spec("muon"), preset=preset, lr=0.01)  # noqa: E731
    opt, twin_opt = make(model), make(twin)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e20
    with pytest.raises(NonFiniteUpdateError, match=r"(?s)(?=.*changed nothing)(?=.*stats_dtype='float64')"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
    x = torch.randn(8, 8)
    for _ in range(3):
        for m, o in ((model, opt), (twin, twin_opt)):
            o.zero_grad()
            m(x).square().sum().backward()
            o.step()
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n


def test_leaving_frozen_parameters_out_works_with_a_warning():
    """mlp_tanh.toml names each parameter; the torch idiom leaves the frozen fc1.weight out of the optimizer."""
    model = MLP((8, 16, 12, 4))
    model.fc1.weight.requires_grad_(False)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    spec = symo.load_spec("mlp_tanh")
    with pytest.warns(UserWarning, match=r"fc1.weight.*If frozen parameters were left out"):
        opt = Symo(trainable, spec, lr=0.02)
    assert "fc1.weight" not in opt.assignment and opt.assignment["fc2.weight"] == "symo"
    model(torch.randn(4, 8)).square().sum().backward()
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Symo(trainable, spec, lr=0.02, strict=False)   # said explicitly: no warning
    with pytest.raises(ValueError, match="matches no parameter"):
        Symo(trainable, spec, lr=0.02, strict=True)


def test_two_groups_becoming_four_is_said_and_each_knows_its_group():
    model = MLP((8, 16, 12, 4))
    named = list(model.named_parameters())
    opt = Symo([{"params": named[:2]}, {"params": named[2:], "lr": 0.01}], MUON, lr=0.02)
    assert [(g["user_group"], g["kind"]) for g in opt.param_groups] == [(0, "symo"), (0, "adamw"), (1, "symo"),
                                                                         (1, "adamw")]
    assert "param groups: 2 given -> 4 torch groups" in opt.describe()
    assert "param groups" not in Symo(named, MUON).describe()
