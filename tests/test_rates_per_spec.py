"""One documented rate per preset, whatever the spec: on an MLP written here, each preset's best rate over the
grid documented x {1/9, 1/3, 1, 3, 9} is within 3x of the documented rate (a rate within 5% of the lowest loss
counts as best), and the documented rate's loss within 1.5x of the best, with the network's true-symmetry spec
(`symo.infer.infer_spec`: hidden units permuted, whole matrices and a layer's rows with the next layer's columns
in shared blocks) and with its Muon-style spec (`symo.infer.training_spec`: one block per hidden matrix, the rest
to AdamW).

The problem: a 32-64-64-64-6 tanh MLP regressing a random tanh teacher (outputs standardised), 600 steps of
batch 64, rate decayed linearly to 0, validation MSE on held-out inputs. Muon's scale without the
per-parameter RMS (`parameter_rms=False`) is the control: under the true spec its best rate sits 3x below
the documented one and the documented rate's loss is several times the best, so the test can fail.

The Adam-like presets (eigen_adam and soap, 9e-3) are held to the same bounds. soap runs on a narrower copy of
the MLP (hidden width 16): on the true spec a hidden matrix whose rows and columns are both permuted is one block
of width rows x cols, whose second side is a (rows x cols)^2 factor (4096 x 4096 at width 64, minutes per run on
CPU; 256 x 256 at width 16).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import symo
from symo.infer import infer_spec, training_spec
from symo.optim.parameter_rms import match_rms, rms_targets

IN, HIDDEN, OUT, STEPS, BATCH = 32, 64, 6, 600, 64
FACTORS = (1 / 9, 1 / 3, 1.0, 3.0, 9.0)
TIE = 1.05  # losses within 5% of the grid's lowest are one optimum (best_factor)


def mlp(hidden: int = HIDDEN) -> nn.Sequential:
    return nn.Sequential(nn.Linear(IN, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, OUT))


def regression_data() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(123)
    teacher = nn.Sequential(nn.Linear(IN, 32), nn.Tanh(), nn.Linear(32, OUT))
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
        x, xv = torch.randn(4096, IN, generator=g), torch.randn(1024, IN, generator=g)
        y, yv = teacher(x), teacher(xv)
    mu, sd = y.mean(0), y.std(0)
    return x, (y - mu) / sd, xv, (yv - mu) / sd


DATA = regression_data()
torch.manual_seed(0)
SPECS = {"true": infer_spec(mlp()), "muon-style": training_spec(mlp())}
NARROW = 16  # soap's width (see the module docstring)


def validation_mse(preset: str, spec: str, lr: float, hidden: int = HIDDEN, **options) -> float:
    x, y, xv, yv = DATA
    torch.manual_seed(0)
    model = mlp(hidden)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the true spec's whole-matrix blocks warn (a small statistic), by design
        spec_of = SPECS[spec] if hidden == HIDDEN else (infer_spec if spec == "true" else training_spec)(model)
        opt = symo.Symo(model.named_parameters(), spec_of, lr=lr, preset=preset, **options)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 - t / STEPS)
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        i = torch.randint(0, len(x), (BATCH,), generator=gen)
        loss = (model(x[i]) - y[i]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    with torch.no_grad():
        mse = (model(xv) - yv).pow(2).mean().item()
    return mse if math.isfinite(mse) else math.inf


def grid(preset: str, spec: str, hidden: int = HIDDEN, **options) -> dict[float, float]:
    documented = symo.PRESETS[preset].lr
    return {f: validation_mse(preset, spec, documented * f, hidden, **options) for f in FACTORS}


def best_factor(losses: dict[float, float]) -> float:
    """The grid's optimum: of the rates whose loss is within TIE of the lowest, the one nearest the documented
    rate. Where the loss is flat past the optimum, which grid point is lowest is float32 rounding: soap on the
    narrow Muon-style MLP ends 0.2490 at 3x and 0.2405 at 9x on one thread, the other way round on two."""
    low = min(losses.values())
    return min((f for f in losses if losses[f] <= TIE * low), key=lambda f: abs(math.log(f)))


@pytest.mark.parametrize("spec", ["true", "muon-style"])
@pytest.mark.parametrize("preset", ["muon", "then_orthogonalize"])
def test_muon_scale_presets_keep_their_rate_on_both_specs(preset: str, spec: str) -> None:
    losses = grid(preset, spec)
    best = best_factor(losses)
    assert 1 / 3 <= best <= 3, (preset, spec, losses)
    assert losses[1.0] <= 1.5 * losses[best], (preset, spec, losses)


def test_without_the_per_parameter_rms_the_true_spec_wants_another_rate() -> None:
    """The control: Muon's per-block factor alone moves the true spec's whole-matrix blocks sqrt(fan_in) times
    Muon's per-entry RMS, so its documented rate overshoots."""
    losses = grid("muon", "true", parameter_rms=False)
    best = best_factor(losses)
    assert best < 1.0 and losses[1.0] > 2 * losses[best], losses


@pytest.mark.parametrize("spec", ["true", "muon-style"])
@pytest.mark.parametrize(("preset", "hidden"), [("eigen_adam", HIDDEN), ("soap", NARROW)])
def test_adam_like_presets_have_one_rate_for_both_specs(preset: str, hidden: int, spec: str) -> None:
    losses = grid(preset, spec, hidden)
    best = best_factor(losses)
    assert 1 / 3 <= best <= 3, (preset, spec, losses)
    assert losses[1.0] <= 1.5 * losses[best], (preset, spec, losses)


def test_which_parameters_move_at_muons_per_shape_rms() -> None:
    """Muon-style blocks (a matrix's own rows x cols) keep Muon's update; the true spec's shared and whole-matrix
    blocks are rescaled, each parameter to 1/sqrt(numel / rows)."""
    shapes = {n: tuple(p.shape) for n, p in mlp().named_parameters()}
    muon_style = symo.compile(SPECS["muon-style"], shapes, strict=False)
    true = symo.compile(SPECS["true"], shapes)
    assert rms_targets(muon_style) == {}
    targets = rms_targets(true)
    assert set(targets) == set(true.param_names) and len(targets) == len(shapes) - 1  # the output bias: AdamW
    assert targets["2.weight"] == pytest.approx(1 / math.sqrt(HIDDEN))
    assert targets["0.weight"] == pytest.approx(1 / math.sqrt(IN))
    assert targets["0.bias"] == pytest.approx(1 / math.sqrt(HIDDEN))  # a vector counts as one row


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_matching_keeps_zero_directions_and_low_precision_finite(dtype: torch.dtype) -> None:
    directions = {"a": torch.zeros(4, 3, dtype=dtype), "b": torch.full((5,), 1e-30).to(dtype),
                  "c": torch.randn(6, 8).to(dtype) * 1e4}
    out = match_rms(directions, {"a": 0.5, "b": 0.5, "c": 1 / math.sqrt(8)})
    assert torch.equal(out["a"], directions["a"])
    for name in ("b", "c"):
        assert out[name].dtype == dtype and bool(torch.isfinite(out[name]).all())
    rms = out["c"].float().pow(2).mean().sqrt().item()
    assert rms == pytest.approx(1 / math.sqrt(8), rel=1e-2)
