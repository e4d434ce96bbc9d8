"""What a training step of the run will cost against AdamW's, measured on the model before the first step.

`symo train` shows one line when the chosen optimizer makes a step more than `SHOWN_ABOVE` times as long as
AdamW's would be on the same model: some presets pay for their curvature (the published step recomputes two
float64 eigendecompositions per block at every step: 4x AdamW's training step on the default GPT, one thread)
and the run should say so before it spends an hour. The measurement takes a second or two: a copy of the model,
one batch of random token ids of the run's size, a forward and backward pass, then a few steps of the chosen
optimizer and of torch's AdamW on those gradients, with the run's threads and device. The run itself is not
touched: the copies are thrown away and the random state is restored, so a run is the same with or without the
measurement.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

SHOWN_ABOVE = 3.0
"""A step costlier than this many AdamW steps on the same model is announced."""
TIME_BUDGET_S = 2.0
"""The optimizer's timed steps stop once they have taken this long (at least one is timed)."""


@dataclass(frozen=True)
class StepCost:
    """Milliseconds of one training step's parts on the run's model."""

    optimizer_ms: float        # the chosen optimizer's step (mean over a refresh cycle where it has one)
    adamw_ms: float            # torch.optim.AdamW's step on the same parameters
    forward_backward_ms: float
    steps: int                 # optimizer steps timed

    @property
    def step_ms(self) -> float:
        return self.forward_backward_ms + self.optimizer_ms

    @property
    def adamw_step_ms(self) -> float:
        return self.forward_backward_ms + self.adamw_ms

    @property
    def ratio(self) -> float:
        """A training step with the chosen optimizer against one with AdamW."""
        return self.step_ms / self.adamw_step_ms

    def line(self) -> str:
        """The line `symo train` prints when the ratio is above SHOWN_ABOVE."""
        return (f"expected cost: about {self.ratio:.0f}x AdamW's step on this model ({self.step_ms:.0f} ms vs "
                f"{self.adamw_step_ms:.0f} ms a training step: the optimizer's step {self.optimizer_ms:.0f} ms against "
                f"AdamW's {self.adamw_ms:.1f} ms, forward and backward {self.forward_backward_ms:.0f} ms; measured on "
                f"{self.steps} step(s) before training)")


def refresh_interval(opt: torch.optim.Optimizer) -> int:
    """Steps between the optimizer's factor refreshes (Symo's precondition_frequency), 1 for the others."""
    pre = getattr(getattr(opt, "config", None), "preconditioner", None)
    value = pre.option("precondition_frequency", 1) if hasattr(pre, "option") else 1
    return value if isinstance(value, int) and value >= 1 else 1


def measure_step_cost(model: torch.nn.Module, make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
                      batch_size: int, block_size: int, vocab_size: int, device: str) -> StepCost:
    """The cost of one training step of `model` (a GPT: model(x, y) returns (logits, loss)) with the optimizer
    `make_optimizer` builds, and with AdamW, on copies of the model; the model and the random state are left as
    they were. A refresh cycle of k steps (precondition_frequency k) is timed whole within TIME_BUDGET_S, so the
    mean counts its refresh."""
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    gpus = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=gpus), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the run's own optimizer says what it has to say
        net = copy.deepcopy(model)
        gen = torch.Generator(device=dev).manual_seed(0)
        x, y = (torch.randint(vocab_size, (batch_size, block_size), generator=gen, device=dev) for _ in range(2))
        fb = []
        for _ in range(2):  # the first pass allocates; the second is timed
            net.zero_grad(set_to_none=True)
            sync()
            start = time.perf_counter()
            net(x, y)[1].backward()
            sync()
            fb.append(time.perf_counter() - start)
        grads = [p.grad for p in net.parameters()]
        opt = make_optimizer(net)
        optimizer_s = _timed_steps(opt, net, grads, max(2, refresh_interval(opt)), sync)
        twin = copy.deepcopy(net)
        adamw = torch.optim.AdamW(twin.parameters(), lr=1e-3, betas=(0.9, 0.95))
        adamw_s = _timed_steps(adamw, twin, grads, 3, sync)
    return StepCost(optimizer_ms=1e3 * _mean(optimizer_s), adamw_ms=1e3 * min(adamw_s),
                    forward_backward_ms=1e3 * fb[-1], steps=len(optimizer_s))


def _timed_steps(opt: torch.optim.Optimizer, net: torch.nn.Module, grads: list[torch.Tensor], count: int,
                 sync: Callable[[], None]) -> list[float]:
    """Seconds of `count` steps (fewer once TIME_BUDGET_S is spent) after one untimed warm-up step."""
    times: list[float] = []
    for k in range(count + 1):
        for p, g in zip(net.parameters(), grads):
            p.grad = g
        sync()
        start = time.perf_counter()
        opt.step()
        sync()
        if k:
            times.append(time.perf_counter() - start)
            if sum(times) > TIME_BUDGET_S:
                break
    return times


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
