"""`symo train` measures a training step's cost against AdamW's on the run's model before the first step, and
prints one line when it is above 3x AdamW's; `--precondition-frequency` sets a refreshing preset's schedule."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch
from cases import tiny

from symo import cli
from symo.cli.train import ConsoleReport
from symo.train import TrainConfig, TrainObserver, build_optimizer, train
from symo.train.config import check_given
from symo.train.cost import StepCost, measure_step_cost
from symo.train.events import RunStart
from symo.train.models import GPT, GPTConfig


class Slow(torch.optim.SGD):
    """SGD that takes 30 ms more per step: a costly optimizer."""

    def step(self, closure=None):
        time.sleep(0.03)
        return super().step(closure)


def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16))


def test_the_measurement_leaves_the_model_and_the_random_state_as_they_were():
    model = gpt()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    cost = measure_step_cost(model, lambda m: Slow(m.parameters(), lr=0.1), 2, 8, 11, "cpu")
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert cost.optimizer_ms >= 30 and 0 < cost.adamw_ms < cost.optimizer_ms and cost.forward_backward_ms > 0
    assert cost.ratio > 3 and cost.steps == 2
    assert cost.line().startswith(f"expected cost: about {cost.ratio:.0f}x AdamW's step on this model (")


def test_a_refreshing_preset_is_timed_over_its_whole_cycle(tmp_path):
    """precondition_frequency 4: four steps after the warm-up, so the mean counts the step that refreshes."""
    cfg = tiny(tmp_path, preset="published", precondition_frequency=4)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=cfg.block_size, vocab_size=20, n_layer=cfg.n_layer, n_head=cfg.n_head,
                          n_embd=cfg.n_embd))
    opt = build_optimizer(model, cfg)
    assert opt.config.preconditioner.precondition_frequency == 4
    cost = measure_step_cost(model, lambda m: build_optimizer(m, cfg), 2, cfg.block_size, 20, "cpu")
    assert cost.steps == 4 and math.isfinite(cost.ratio)


def test_symo_train_prints_the_line_only_above_three_times_adamw(capsys):
    def started(ratio_ms: float, **options) -> str:
        cost = StepCost(optimizer_ms=ratio_ms, adamw_ms=1.0, forward_backward_ms=9.0, steps=2)
        run = RunStart(config=TrainConfig(**options), run_dir=Path("runs/x"), world=1, n_params=10, data_name="d",
                       n_chars=100, vocab_size=5, start_step=0, resumed=False, step_cost=cost)
        report = ConsoleReport(show_bar=False)
        report.started(run)
        report.bar.close()
        return capsys.readouterr().out

    out = started(71.0, preset="published")  # (9 + 71) / (9 + 1) = 8x
    assert "expected cost: about 8x AdamW's step on this model (80 ms vs 10 ms a training step" in out
    assert "factors at every step; --precondition-frequency 3 recomputes them every third" in out
    assert "The cost of a step" in out
    assert "--precondition-frequency" not in started(71.0, preset="published", precondition_frequency=10)
    assert "every 5 steps; --precondition-frequency N" in started(71.0, preset="notebook", precondition_frequency=5)
    assert "expected cost" not in started(19.0, preset="published")  # 2.8x: not shown
    assert ConsoleReport().wants_step_cost() and not TrainObserver().wants_step_cost()


def test_train_measures_only_for_an_observer_that_asks_and_the_run_is_the_same(tmp_path):
    class Asks(TrainObserver):
        def wants_step_cost(self) -> bool:
            return True

        def started(self, run: RunStart) -> None:
            self.cost = run.step_cost

    asks = Asks()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    measured = train(tiny(tmp_path / "a", steps=3), observer=asks)
    plain = train(tiny(tmp_path / "b", steps=3))
    assert isinstance(asks.cost, StepCost) and asks.cost.optimizer_ms > 0
    assert measured["history"]["train_loss"][1:] == plain["history"]["train_loss"][1:]  # [0]: NaN, before step 1
    assert all(torch.equal(p, q) for p, q in zip(measured["model"].parameters(), plain["model"].parameters()))


def test_precondition_frequency_needs_a_refreshing_preset(tmp_path):
    with pytest.raises(ValueError, match="--precondition-frequency applies to --optimizer symo with a --preset that "
                                         "refreshes its factors .*published"):
        tiny(tmp_path, preset=None, precondition_frequency=10)  # Symo's defaults keep no factors
    assert tiny(tmp_path, precondition_frequency=10).preset == "soap_muon"  # the default preset refreshes its own
    with pytest.raises(ValueError, match="--precondition-frequency: --preset muon keeps no factors to refresh"):
        tiny(tmp_path, preset="muon", precondition_frequency=10)
    with pytest.raises(ValueError, match="--precondition-frequency must be >= 1, got 0"):
        tiny(tmp_path, preset="published", precondition_frequency=0)
    with pytest.raises(ValueError, match="--precondition-frequency: not used by --optimizer adamw"):
        check_given({"precondition_frequency": 10}, "adamw")
    assert cli.main(["train", "--optimizer", "muon", "--precondition-frequency", "2"]) == 2


def test_a_resume_keeps_the_refresh_schedule_and_refuses_another(tmp_path, capsys):
    cfg = tiny(tmp_path, preset="published", precondition_frequency=2, steps=2, eval_interval=1)
    train(cfg)
    assert cli.main(["train", "--resume", cfg.out_dir, "--steps", "3", "--no-progress"]) == 0
    assert cli.main(["train", "--resume", cfg.out_dir, "--steps", "4", "--precondition-frequency", "3"]) == 2
    assert "--precondition-frequency: checkpoint 2 vs now 3" in capsys.readouterr().err
