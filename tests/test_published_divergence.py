"""The published step tells the user when it diverges: a DivergenceWarning within the first steps that show it,
naming the learning rate (read back from the weights' change) and the step, and suggesting a 3-10x lower rate;
none at a rate that trains. A 3-layer tanh MLP regression with its true symmetry (signed permutations of both
hidden layers, cases.MLP2_SPEC); the model is written here."""

from __future__ import annotations

import warnings

import pytest
import torch
from cases import MLP2_SPEC

import symo
from symo.optim import Symo
from symo.optim.divergence import DivergenceWarning, DivergenceWatch

SPEC = MLP2_SPEC.format(h1="signed_perm", h2="signed_perm")
pytestmark = pytest.mark.filterwarnings("ignore:spec .* shares? one small statistic:UserWarning")  # fc2.weight's block


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(8, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def train(lr: float, steps: int, **options) -> tuple[list[float], list[tuple[int, warnings.WarningMessage]]]:
    """The losses of `steps` published steps on a fixed regression batch, and the DivergenceWarnings with their step;
    stops at the first non-finite gradient."""
    torch.manual_seed(0)
    model = MLP()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(256, 8, generator=gen), torch.randn(256, 4, generator=gen)
    opt = Symo(model.named_parameters(), symo.parse_spec(SPEC), preset="published", lr=lr, **options)
    losses, caught = [], []
    for t in range(1, steps + 1):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", DivergenceWarning)
            try:
                opt.step()
            except symo.NonFiniteGradientError:
                break
        caught += [(t, w) for w in seen if issubclass(w.category, DivergenceWarning)]
    return losses, caught


@pytest.mark.parametrize("lr, weight_decay", [(1.5, 0.0), (2.5, 0.1)])
def test_a_rate_that_blows_up_is_named_with_the_step_before_the_values_overflow(lr, weight_decay):
    losses, caught = train(lr, 40, weight_decay=weight_decay)
    assert max(losses) > 1e6  # the run does blow up (and raises NonFiniteGradientError later)
    assert len(caught) == 1  # once
    step, w = caught[0]
    assert step <= 12 and losses[step - 1] < 1e3  # within the first steps that show it, long before 1e6
    text = str(w.message)
    assert f"learning rate {lr:g}" in text and f"at step {step})" in text
    assert f"lr={lr / 10:.2g} to {lr / 3:.2g}" in text and "does not transfer between problems" in text
    assert w.filename == __file__  # it points at the caller's opt.step()


def test_no_warning_at_a_rate_that_trains():
    losses, caught = train(0.05, 100)
    assert not caught and losses[-1] < 0.9 * losses[0]


def test_the_rate_is_not_named_when_the_weights_change_outside_the_optimizer():
    """Weights scaled by hand between the steps: the rate cannot be read back, the message says so."""
    watch = DivergenceWatch("published")
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(2, 5, 7, generator=gen)
    with pytest.warns(DivergenceWarning, match="at its learning rate: .* grew 16x in 4 steps.*lower it 3-10x and"):
        for step in range(1, 6):
            watch.weights(step, {"L0": w})
            z = torch.randn(2, 5, 7, generator=gen)
            watch.updates({"L0": z})
            w = 2 * w - 0.1 * z
    assert watch.warned


def test_slow_growth_is_not_divergence():
    """The norm doubling every 10 steps (7% a step) for 100 steps: no warning."""
    watch = DivergenceWatch("published")
    w = torch.ones(1, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DivergenceWarning)
        for step in range(1, 101):
            watch.weights(step, {"L0": w * 2 ** (step / 10)})
            watch.updates({"L0": w})


def test_float32_statistics_follow_the_float64_step():
    """stats_dtype="float32" (eigendecompositions in float32, about half the step's time): the damping keeps every
    power's condition number below 1e4, so ten steps stay within 1e-5 of the float64 step."""
    def weights(dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        model = MLP()
        start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
        gen = torch.Generator().manual_seed(1)
        x, y = torch.randn(256, 8, generator=gen), torch.randn(256, 4, generator=gen)
        opt = Symo(model.named_parameters(), symo.parse_spec(SPEC), preset="published", lr=0.05, stats_dtype=dtype)
        for _ in range(10):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
        assert opt.block_statistics()["L0"]["precond"].dtype == getattr(torch, dtype)
        return start, torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    start, w64 = weights("float64")
    _, w32 = weights("float32")
    assert float((w32 - w64).norm() / (w64 - start).norm()) < 1e-5
