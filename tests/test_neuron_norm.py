"""NorMuon's neuron-wise normalization (`neuron_norm_beta2`) against the library that ships NorMuon, never against a
reference written in Symo's conventions:

- `preset="muon"` with `neuron_norm_beta2=0.95` on a Muon-style spec is pytorch-optimizer's `NorMuon` on the same
  model (its Newton-Schulz run in float32 as Symo's is): 30 steps on wide and tall matrices, to 1e-4 of the
  distance moved (both apply Muon's per-shape factor sqrt(max(1, rows / cols)));
- the step is equivariant under the row permutations the spec declares;
- a spec that rotates a matrix's rows, a kind without a polar factor, a bad rate, and DTensor parameters outside
  the fsdp mode are refused by name; DDP and FSDP2 on one rank step as one process (several ranks:
  tests/test_distributed.py);
- float32 and bfloat16 on rank-deficient gradients with zero rows: never a NaN; a checkpoint resumes exactly.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist
from distributed_cases import free_port, init
from helpers import keep_newton_schulz
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import symo
from benchmarks.nanogpt_matrix_runs import newton_schulz_in_float32
from symo.optim import Symo
from symo.optim.neuron_norm import STATE_KEY

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")

MUON_STYLE = '[spaces]\n"r{i}" = "signed_perm"\n[params]\n"{i}.weight" = ["r{i}", "_"]\n'
ROTATED_ROWS = ('[spaces]\n"h" = "identity"\n"d" = { group = "orthogonal", per = "h" }\n'
                '[params]\n"0.weight" = ["(h d)", "_"]\n')
SHAPES = ((6, 4), (4, 8), (8, 6))  # (in, out): weights wide 4 x 6, tall 8 x 4, wide 6 x 8


def mlp(dtype: torch.dtype = torch.float64) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for fan_in, fan_out in SHAPES:
        layers += [torch.nn.Linear(fan_in, fan_out, bias=False, dtype=dtype), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def batch(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(32, 6, generator=gen, dtype=dtype), torch.randn(32, 6, generator=gen, dtype=dtype)


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()


def test_muon_with_neuron_norm_is_pytorch_optimizers_normuon(monkeypatch):
    keep_newton_schulz(monkeypatch, pytorch_optimizer.NorMuon)  # the library's iteration in float32, Symo's
    newton_schulz_in_float32(pytorch_optimizer.NorMuon)           # precision (it fixes bfloat16); restored after
    a, b = mlp(), mlp()
    opt_a = Symo(a.named_parameters(), symo.parse_spec(MUON_STYLE), preset="muon", lr=0.02, neuron_norm_beta2=0.95,
                 ns_method="iterate")
    opt_b = pytorch_optimizer.NorMuon([{"params": list(b.parameters()), "use_muon": True}], lr=0.02, beta2=0.95)
    x, y = batch()
    start = [p.detach().clone() for p in b.parameters()]
    gaps = []
    for _ in range(30):
        step(a, opt_a, x, y)
        step(b, opt_b, x, y)
        moved = math.sqrt(sum(float((p.detach() - q).norm() ** 2) for p, q in zip(b.parameters(), start)))
        gaps.append(math.sqrt(sum(float((p - q).norm() ** 2) for p, q in zip(a.parameters(), b.parameters())))
                    / moved)
    assert max(gaps) < 1e-4, gaps  # float32 iterations on both sides: ~1e-5 apart
    assert "neuron_norm_beta2=0.95 (NorMuon's rows)" in opt_a.describe()
    # and the normalization is not a no-op: plain Muon through Symo ends elsewhere
    c = mlp()
    opt_c = Symo(c.named_parameters(), symo.parse_spec(MUON_STYLE), preset="muon", lr=0.02, ns_method="iterate")
    for _ in range(30):
        step(c, opt_c, x, y)
    assert sum(float((p - q).norm()) for p, q in zip(c.parameters(), b.parameters())) > 1e-2


def test_the_step_moves_with_a_permutation_of_the_rows():
    """Permuting layer 0's rows (and layer 1's columns, which read them) leaves the loss unchanged; the trained
    weights are the permuted trained weights, the per-row statistic included."""
    a = mlp()
    b = copy.deepcopy(a)
    perm = torch.randperm(4, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        b[0].weight.copy_(a[0].weight[perm])
        b[2].weight.copy_(a[2].weight[:, perm])
    spec = symo.parse_spec(MUON_STYLE)
    opts = [Symo(m.named_parameters(), spec, preset="muon", lr=0.05, neuron_norm_beta2=0.9) for m in (a, b)]
    x, y = batch()
    for _ in range(5):
        for m, o in zip((a, b), opts):
            step(m, o, x, y)
    torch.testing.assert_close(b[0].weight, a[0].weight[perm], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(b[2].weight, a[2].weight[:, perm], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(opts[1].state[b[0].weight][STATE_KEY], opts[0].state[a[0].weight][STATE_KEY][perm])


def test_a_spec_that_rotates_the_rows_is_refused_with_the_parameter_and_the_space():
    model = torch.nn.Sequential(torch.nn.Linear(6, 4, bias=False))
    with pytest.raises(ValueError, match=r"neuron_norm_beta2: spec .* rotates the rows of '0.weight' \(orthogonal "
                                         r"space 'd'"):
        Symo(model.named_parameters(), symo.parse_spec(ROTATED_ROWS), preset="muon", sizes={"d": 2},
             neuron_norm_beta2=0.95)
    Symo(model.named_parameters(), symo.parse_spec(ROTATED_ROWS), preset="muon", sizes={"d": 2})  # off: accepted


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"preset": "soap"}, ValueError, r"preconditioner 'eigen_adam' has none: use preset='muon'"),
    ({"preset": "muon", "neuron_norm_beta2": 1.0}, ValueError, r"neuron_norm_beta2 must be in \[0, 1\) or None"),
    ({"preset": "muon", "neuron_norm_beta2": "0.95"}, TypeError, r"neuron_norm_beta2 must be"),
])
def test_bad_settings_are_refused_by_name(options, error, message):
    options = {"neuron_norm_beta2": 0.95, **options}
    with pytest.raises(error, match=message):
        Symo(mlp().named_parameters(), symo.parse_spec(MUON_STYLE), **options)


def test_ddp_and_fsdp2_on_one_rank_step_as_one_process_and_the_implicit_path_is_refused():
    """In a process group of one, the replicated (DDP) and fsdp (FSDP2, DTensor parameters) modes have a
    distributor as on several ranks: both end where one process ends (FSDP2 to the rounding of its norms, taken
    from summed squares). FSDP2's row statistic is a DTensor of one entry per row placed as its parameter, and a
    consolidated checkpoint resumes it in one process and sharded. DTensor parameters under
    distributed_mode='off' are refused by name. (tests/test_distributed.py: 2 and 4 ranks.)"""
    spec = symo.parse_spec(MUON_STYLE)
    x, y = batch()
    alone = mlp()
    opt = Symo(alone.named_parameters(), spec, preset="muon", lr=0.02, neuron_norm_beta2=0.95)
    for _ in range(5):
        step(alone, opt, x, y)
    init(0, 1, free_port())
    try:
        ddp = mlp()
        opt = Symo(ddp.named_parameters(), spec, preset="muon", lr=0.02, distributed_mode="replicated",
                   neuron_norm_beta2=0.95)
        assert opt.distributor is not None
        for _ in range(5):
            step(ddp, opt, x, y)
        for p, q in zip(alone.parameters(), ddp.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
        sharded = mlp()
        for layer in sharded[::2]:
            fully_shard(layer)
        opt = Symo(sharded.named_parameters(), spec, preset="muon", lr=0.02, neuron_norm_beta2=0.95)
        assert opt.distributor is not None and opt.distributor.mode == "fsdp"
        for _ in range(5):
            step(sharded, opt, x, y)
        for p, q in zip(alone.parameters(), sharded.parameters()):
            torch.testing.assert_close(p, q.full_tensor(), rtol=1e-12, atol=0)
        statistic = opt.state[sharded[2].weight][STATE_KEY]
        assert isinstance(statistic, DTensor) and tuple(statistic.shape) == (8, 1)
        assert statistic.placements == sharded[2].weight.placements
        # the consolidated checkpoint resumes in one process and sharded again
        whole, resharded = mlp(), mlp()
        for layer in resharded[::2]:
            fully_shard(layer)
        with torch.no_grad():
            for p, q, r in zip(whole.parameters(), resharded.parameters(), sharded.parameters()):
                p.copy_(r.full_tensor())
                q.copy_(r)
        resumed = []
        for model in (whole, resharded):
            resumed.append(Symo(model.named_parameters(), spec, preset="muon", lr=0.02, neuron_norm_beta2=0.95))
            resumed[-1].load_state_dict(opt.full_state_dict())
        assert tuple(resumed[1].state[resharded[2].weight][STATE_KEY].shape) == (8, 1)
        for _ in range(2):
            for model, o in ((sharded, opt), (whole, resumed[0]), (resharded, resumed[1])):
                step(model, o, x, y)
        for p, q, r in zip(whole.parameters(), resharded.parameters(), sharded.parameters()):
            torch.testing.assert_close(p, r.full_tensor(), rtol=1e-12, atol=0)
            torch.testing.assert_close(q.full_tensor(), r.full_tensor(), rtol=0, atol=0)
        with pytest.raises(ValueError, match=r"neuron_norm_beta2 with DTensor parameters \('0.weight'\) needs "
                                             r"distributed_mode='fsdp' \(or 'auto'\), not 'off'"):
            Symo(sharded.named_parameters(), spec, preset="muon", distributed_mode="off", neuron_norm_beta2=0.95)
    finally:
        dist.destroy_process_group()


def test_a_frozen_covered_matrix_is_left_alone():
    """A covered matrix without a gradient (requires_grad=False) gets no row statistic and does not move; the
    others step."""
    spec = symo.parse_spec(MUON_STYLE)
    x, y = batch()
    frozen = mlp()
    frozen[2].weight.requires_grad_(False)
    before = frozen[2].weight.detach().clone()
    opt = Symo(frozen.named_parameters(), spec, preset="muon", lr=0.02, neuron_norm_beta2=0.95)
    for _ in range(3):
        step(frozen, opt, x, y)
    assert torch.equal(frozen[2].weight, before) and STATE_KEY not in opt.state[frozen[2].weight]
    assert STATE_KEY in opt.state[frozen[0].weight]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("preset", ["muon", "soap_muon"])
def test_rank_deficient_gradients_with_zero_rows_never_give_a_nan(dtype, preset):
    """A rank-one gradient whose row 0 is zero (a dead unit), scaled from 1e-15 to 1e15 (its squares stay inside
    float32's range), and a zero gradient: finite weights, and the dead row never moves (its update and its
    statistic are 0, and 0 / (0 + eps) is 0)."""
    w = torch.nn.Parameter(torch.randn(8, 5, dtype=dtype))
    opt = Symo([("0.weight", w)], symo.parse_spec(MUON_STYLE), preset=preset, lr=0.02, neuron_norm_beta2=0.95)
    row0 = w.detach()[0].clone()
    u = torch.randn(8, 1)
    u[0] = 0.0
    for scale in (1.0, 1e-15, 1e15, 1.0, 0.0, 1.0):
        w.grad = (scale * u @ torch.randn(1, 5)).to(dtype)
        opt.step()
        assert bool(torch.isfinite(w).all()), scale
    assert torch.equal(w.detach()[0], row0)


def test_a_checkpoint_resumes_the_same_run(tmp_path):
    a = mlp()
    spec = symo.parse_spec(MUON_STYLE)
    opt = Symo(a.named_parameters(), spec, preset="muon", lr=0.02, neuron_norm_beta2=0.95)
    x, y = batch()
    for _ in range(3):
        step(a, opt, x, y)
    torch.save({"model": a.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    for _ in range(3):
        step(a, opt, x, y)
    b = mlp()
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    b.load_state_dict(saved["model"])
    opt_b = Symo(b.named_parameters(), spec, preset="muon", lr=0.02, neuron_norm_beta2=0.95)
    opt_b.load_state_dict(saved["opt"])
    assert STATE_KEY in opt_b.state[b[0].weight]
    for _ in range(3):
        step(b, opt_b, x, y)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
