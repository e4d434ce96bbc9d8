"""`symo.optim.Symo` as a torch optimizer: state_dict round trips continue bit for bit, bfloat16 parameters with
their statistics' dtype, lr schedulers, frozen and gradient-less parameters and closures, non-finite gradients named
by parameter, Muon's hot path as one graph (the update itself against references: test_optim.py)."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from cases import sensing_loss
from helpers import rel
from optim_cases import COLS, FACTORED, MUON, regression, train

from symo.optim import Symo
from symo.optim.kinds.base import StepContext
from symo.optim.step import polar_step
from symo.runtime.compiled import NonFiniteGradientError
from symo.train.models import MLP, Factored


@pytest.mark.parametrize("dtype,options", [
    (torch.float32, dict(backend="newton_schulz", update_scale="muon")),
    (torch.bfloat16, dict(preconditioner="root", beta2=0.95, precondition_frequency=3, update_scale="adamw")),
    (torch.float64, dict(preconditioner="root", beta2=0.9, geometric_mean_with=COLS, statistic="gradient")),
])
def test_state_dict_round_trip_continues_bit_identically(dtype, options):
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4)).to(dtype)
    twin = copy.deepcopy(model)
    make = lambda m: Symo(m.named_parameters(), MUON, lr=0.01, **options)  # noqa: E731
    opt = make(model)
    train(model, [opt], regression(model, dtype), 4)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, saved)
    train(model, [opt], regression(model, dtype), 6)            # the uninterrupted run

    saved.seek(0)
    ckpt = torch.load(saved, weights_only=False)
    twin.load_state_dict(ckpt["model"])
    opt2 = make(twin)
    opt2.load_state_dict(ckpt["opt"])
    train(twin, [opt2], regression(twin, dtype), 6)
    for (n, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), n
    bufs = [opt2.state[p]["momentum_buffer"] for p in twin.parameters() if "momentum_buffer" in opt2.state[p]]
    assert bufs and all(b.dtype == torch.promote_types(dtype, torch.float32) for b in bufs)


@pytest.mark.parametrize("stats_dtype,want", [("auto", torch.float64), ("float32", torch.float32)])
def test_bfloat16_trains_with_float64_statistics_by_default(stats_dtype, want):
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4)).to(torch.bfloat16)
    opt = Symo(model.named_parameters(), MUON, preconditioner="root", lr=0.02, beta2=0.9, update_scale="muon",
               adamw_lr=1e-2,
               stats_dtype=stats_dtype)
    loss_fn = regression(model, torch.bfloat16)
    first = float(loss_fn().detach())
    train(model, [opt], loss_fn, 20)
    assert float(loss_fn().detach()) < first
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(st["ema"].dtype == want for st in opt.block_statistics().values())
    assert all(opt.state[p]["exp_avg"].dtype == torch.float32 for p in (model.fc1.bias, model.fc2.bias))


def test_lr_scheduler_scales_both_kinds_of_group():
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4)).double()
    opt = Symo(model.named_parameters(), MUON, lr=0.02, adamw_lr=0.001)
    assert [g["kind"] for g in opt.param_groups] == ["symo", "adamw"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5 ** t)
    loss_fn = regression(model)
    for _ in range(3):
        opt.zero_grad()
        loss_fn().backward()
        opt.step()
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.02 / 8, 0.001 / 8])


def test_frozen_and_gradient_less_parameters_and_closure():
    torch.manual_seed(0)
    # a frozen block-mate: V has no gradient, U's block treats G_V as zero
    model = Factored(10, 8, 3).double()
    model.V.requires_grad_(False)
    v0 = model.V.detach().clone()
    loss = sensing_loss()
    opt = Symo(model.named_parameters(), FACTORED, lr=0.1, beta1=0.0, damping=0.0)
    loss(model).backward()
    g = model.U.grad.clone()
    u0 = model.U.detach().clone()

    def closure():
        opt.zero_grad()
        value = loss(model)
        value.backward()
        return value

    assert float(opt.step(closure).detach()) > 0  # the closure's loss comes back
    evals, evecs = torch.linalg.eigh(g @ g.T)
    keep = evals > 1e-10 * evals.max()
    expected = math.sqrt(3) * (evecs[:, keep] * evals[keep].rsqrt()) @ evecs[:, keep].T @ g
    assert rel((u0 - model.U.detach()) / 0.1, expected) < 1e-10
    assert torch.equal(model.V, v0) and model.V not in opt.state

    # parameters the loss does not touch: no gradient, no update, no state
    mlp = MLP((8, 16, 12, 4)).double()
    fc3 = {n: p.detach().clone() for n, p in mlp.fc3.named_parameters()}
    opt = Symo(mlp.named_parameters(), MUON, lr=0.01)
    x = torch.randn(5, 8, dtype=torch.float64)
    for _ in range(2):
        opt.zero_grad()
        mlp.fc2(torch.tanh(mlp.fc1(x))).square().sum().backward()
        opt.step()
    assert all(torch.equal(p, fc3[n]) for n, p in mlp.fc3.named_parameters())
    assert all(p not in opt.state for p in mlp.fc3.parameters())


def test_non_finite_gradient_names_the_parameter():
    model = MLP((8, 16, 12, 4)).double()
    opt = Symo(model.named_parameters(), MUON, lr=0.01)
    regression(model)().backward()
    model.fc2.weight.grad[0, 0] = float("nan")
    with pytest.raises(NonFiniteGradientError, match="fc2.weight"):
        opt.step()
    model.fc2.weight.grad[0, 0] = 0.0
    model.fc3.bias.grad[0] = float("inf")
    with pytest.raises(NonFiniteGradientError, match="fc3.bias"):
        opt.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_non_finite_check_finds_one_bad_entry_anywhere(dtype):
    """The check first reduces each tensor to its sum, which must carry a single NaN or inf from any
    position (vectorised loops, tails, strided views); empty tensors are skipped, and a finite tensor
    whose sum overflows is not reported."""
    from symo.runtime.compiled import check_finite_tensors

    gen = torch.Generator().manual_seed(0)
    big = torch.randn(1031, 517, generator=gen).to(dtype)
    check_finite_tensors({"big": big, "empty": torch.empty(0, 3, dtype=dtype), "t": big.t()}, ["big", "empty", "t"])
    for flat in (0, 5, 16, 1031 * 517 // 2 + 3, 1031 * 517 - 1):
        for bad in (float("nan"), float("inf"), float("-inf")):
            g = big.clone()
            g.view(-1)[flat] = bad
            with pytest.raises(NonFiniteGradientError, match="'t'"):
                check_finite_tensors({"ok": big, "t": g.t()}, ["ok", "t"])
    huge = torch.full((64, 64), torch.finfo(dtype).max / 2, dtype=dtype)
    assert not torch.isfinite(huge.sum())
    check_finite_tensors({"huge": huge}, ["huge"])  # every entry finite: no error


def test_muon_hot_path_traces_as_one_graph():
    """torch.compile(fullgraph=True) of momentum -> coordinates -> polar -> scatter (dynamo only)."""
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4))
    opt = Symo(model.named_parameters(), MUON, lr=0.02, backend="newton_schulz")
    names = opt.compiled.param_names
    shapes = dict(model.named_parameters())
    grads = [torch.randn_like(shapes[n]) for n in names]
    args = (names, grads)
    compiled = torch.compile(polar_step, fullgraph=True, backend="eager")
    plan = (opt.plan, opt.kind, StepContext(opt.stats_dtype, 0.95, 1, torch.device("cpu")))
    out, _ = compiled(*plan, *args, [torch.zeros_like(g) for g in grads], (0.95,) * 3, (True,) * 3, opt.rms_targets)
    ref, _ = polar_step(*plan, *args, [torch.zeros_like(g) for g in grads], (0.95,) * 3, (True,) * 3,
                        opt.rms_targets)
    assert all(torch.equal(out[n], ref[n]) for n in names)
