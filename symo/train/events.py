"""What `train()` reports while it runs, for whoever shows it.

`train()` itself prints nothing and installs no signal handler. It hands a `TrainObserver` the run's
description at the start, a `StepReport` after every step and the outcome at the end, and asks it
after every step whether to stop. `symo train` (symo/cli/train.py) passes one that prints the header,
draws the progress bar and turns the first Ctrl-C into a stop request; a library caller passes its
own or none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import TrainConfig
    from .cost import StepCost


@dataclass(frozen=True)
class RunStart:
    """The run about to start (or resume): its options, folder and sizes."""

    config: TrainConfig
    run_dir: Path
    world: int               # number of processes
    n_params: int            # the model's parameter count
    data_name: str
    n_chars: int             # length of the encoded corpus
    vocab_size: int
    start_step: int          # steps already done (a resumed run starts there)
    resumed: bool
    schedule_steps: int | None = None  # the steps the learning-rate schedule spans; fewer than config.steps
    #                                    in a run extended by a resume with a larger --steps
    step_cost: StepCost | None = None  # a training step's cost against AdamW's, measured before the first step
    #                                    when the observer asks (`TrainObserver.wants_step_cost`), in one process


@dataclass(frozen=True)
class StepReport:
    """One finished step: its log row (step, lr, train_loss, val_loss, elapsed_s; val_loss is NaN on
    steps without an evaluation), the latest validation loss so far and the recent throughput."""

    step: int
    row: dict[str, float]
    last_val: float
    tokens_per_s: float      # mean over the last 20 steps


class TrainInterrupted(KeyboardInterrupt):
    """`train()` stopped on Ctrl-C, a stop request or a KeyboardInterrupt from its callback.

    `step` is the last whole step; `checkpoint` the file that holds it, or None when the interrupt came
    mid-step (the previous checkpoint is kept); `run_dir` the folder to resume
    (`TrainConfig(resume=True, out_dir=run_dir)`, or `symo train --resume RUN_DIR`).
    """

    def __init__(self, step: int, checkpoint: Path | None, run_dir: Path) -> None:
        if checkpoint is not None:
            text = (f"interrupted: checkpoint of step {step} written to {checkpoint}; continue with: symo train "
                    f"--resume {run_dir}")
        else:
            text = "interrupted mid-step: the last checkpoint was kept"
        super().__init__(text)
        self.step, self.checkpoint, self.run_dir = step, checkpoint, run_dir


class TrainObserver:
    """Hooks `train()` calls; each default does nothing. `started`, `stepped` and `finished` run on the
    lead process only (rank 0 under torchrun); `stop_requested` runs on every process after every step,
    and the run stops when any of them asks (the answers are shared)."""

    def started(self, run: RunStart) -> None:
        """Before the first step (after the model, optimizer and checkpoint are loaded)."""

    def wants_step_cost(self) -> bool:
        """True to have `RunStart.step_cost` measured before `started` (a second or two; symo/train/cost.py)."""
        return False

    def stepped(self, report: StepReport) -> None:
        """After every step, once its log row is recorded (and its checkpoint written, on an evaluation)."""

    def stop_requested(self) -> bool:
        """True to stop after the current step: a checkpoint is written, then `TrainInterrupted` raised."""
        return False

    def finished(self, interrupted: TrainInterrupted | None) -> None:
        """After the last step (None), or on an interrupt (after its checkpoint, before it is raised)."""
