"""`symo train` on the command line: every TrainConfig field as a --flag, and `--resume RUN_DIR` with
the options of the run's checkpoint (symo/train/loop.py does the training). What the run shows on
the terminal lives here, not in the training code: the header, the progress bar, the results, and
Ctrl-C, which stops the run after the current step with a checkpoint (`ConsoleReport`)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import torch.distributed as dist

from .. import train as training  # the package attribute `training.train`, so tests can stand in for train()
from ..compiler import SpecError
from ..optim.presets import get_preset
from ..train.checkpoint import CheckpointError
from ..train.config import TrainConfig, check_given
from ..train.cost import SHOWN_ABOVE
from ..train.data import DataError
from ..train.events import RunStart, StepReport, TrainInterrupted, TrainObserver
from ..train.progress import progress
from ..train.rundir import RunFolderError
from .common import _describe

__all__ = ["ConsoleReport", "train_command"]


def train_command(args: argparse.Namespace) -> int:
    """`symo train ...`: train with the options given (and, with --resume RUN_DIR, the run's others)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    try:
        options = dict(given)
        resume = given.get("resume")
        run_dir = resume if isinstance(resume, str) else given.get("out_dir") if resume else None
        if isinstance(resume, str) and given.get("out_dir") not in (None, resume):
            raise ValueError(f"--resume {resume} and --out-dir {given['out_dir']} name different run folders; "
                             "give one of them")
        if run_dir is not None:  # resuming: the checkpoint's options, then those given on the command line
            options = {**training.saved_options(run_dir), **given, "resume": True, "out_dir": run_dir}
        cfg = TrainConfig(**options)
        check_given(given, cfg.optimizer)
        with ConsoleReport(show_bar=cfg.progress) as report:
            result = training.train(cfg, observer=report)
    except (CheckpointError, DataError, SpecError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunFolderError as exc:  # the folder is in use or cannot be written: a condition of the system, as below
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a run folder or file the system refuses (too long a name, no permission, ...)
        print(f"error: {_describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if dist.is_initialized():  # under torchrun
            dist.destroy_process_group()
    if result.get("sample") is not None:  # rank 0; --no-progress silences only the progress bar
        h = result["history"]
        train_loss = next((v for v in reversed(h["train_loss"]) if v == v), float("nan"))
        ms = result["ms_per_step"]
        speed = f"{ms:.0f} ms/step" if math.isfinite(ms) else ("no steps left (the checkpoint was at the last step; "
                                                                "a larger --steps extends the run)")
        print(f"\nstep {result['steps']}: val loss {result['final_val']:.4f} (train {train_loss:.4f}), "
              f"{h['elapsed_s'][-1]:.0f} s, {speed}")
        if result["sample"]:
            print("\n--- sample ---\n" + result["sample"].strip() + "\n--------------")
        print(f"loss plot: {result.get('plot') or '(none: matplotlib is missing; pip install matplotlib)'}")
        print(f"log: {result['run_dir'] / 'log.csv'}   checkpoint: {result['run_dir'] / 'ckpt.pt'}")
    return 0


class ConsoleReport(TrainObserver):
    """`symo train`'s terminal output and Ctrl-C handling, as an observer of `train()`.

    Prints the run's header and the interrupt message on stdout and draws the progress bar on stderr
    (`show_bar=False`, from --no-progress, leaves out only the bar; on a log file or pipe the bar is
    plain periodic lines). Inside `with`, the first Ctrl-C asks the run to stop after the current step
    (then a checkpoint is written); a second one ends the process at once (status 130), keeping the last
    checkpoint.

    Why a thread: Python runs a signal handler only between bytecodes of the main thread, so while one
    long torch operation runs (a step at a large --block-size takes minutes) a handler waits for it to
    return. The C-level handler still writes each signal's number to the wakeup file descriptor
    (`signal.set_wakeup_fd`) at once; a watcher thread reads them, says what the first Ctrl-C does, and
    on the second calls os._exit. Checkpoints are written atomically, so the last one stays whole.
    """

    def __init__(self, show_bar: bool = True) -> None:
        self.show_bar = show_bar
        self.stop = False
        self.bar: Any = None
        self.previous_handler: Any = None
        self.previous_wakeup: int | None = None
        self.wakeup: socket.socket | None = None
        self.run_dir: Path | None = None

    def __enter__(self) -> ConsoleReport:
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            self.previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
            reader, self.wakeup = socket.socketpair()
            self.wakeup.setblocking(False)  # set_wakeup_fd requires it: a signal never blocks on a full buffer
            self.previous_wakeup = signal.set_wakeup_fd(self.wakeup.fileno(), warn_on_full_buffer=False)
            threading.Thread(target=self._watch, args=(reader,), name="symo-ctrl-c", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous_handler is not None:
            signal.signal(signal.SIGINT, self.previous_handler)
            self.previous_handler = None
        if self.wakeup is not None:
            signal.set_wakeup_fd(self.previous_wakeup)
            self.wakeup.close()  # the watcher reads the end of the stream and stops
            self.wakeup = None

    def _watch(self, reader: socket.socket) -> None:
        """The watcher thread: counts the SIGINTs written to the wakeup descriptor as they arrive."""
        count = 0
        with reader:
            while data := reader.recv(64):
                count += data.count(signal.SIGINT)
                if count == 1 and signal.SIGINT in data:
                    print("\nCtrl-C: stopping after the current step, then writing a checkpoint (Ctrl-C again "
                          "stops at once)", file=sys.stderr, flush=True)
                if count >= 2:
                    ckpt = self.run_dir / "ckpt.pt" if self.run_dir is not None else None
                    kept = (f"the last checkpoint, {ckpt}, is kept; continue with: symo train --resume {self.run_dir}"
                            if ckpt is not None and ckpt.is_file() else "no checkpoint had been written yet")
                    print(f"\nsecond Ctrl-C: stopped at once; {kept}", file=sys.stderr, flush=True)
                    os._exit(130)

    def _on_sigint(self, signum: int, frame: object) -> None:
        if self.stop:
            raise KeyboardInterrupt
        self.stop = True

    def stop_requested(self) -> bool:
        return self.stop

    def started(self, run: RunStart) -> None:
        cfg = run.config
        self.run_dir = run.run_dir
        rates = f"lr {cfg.lr:g}, weight decay {cfg.weight_decay:g}"
        symo = f"{f'preset {cfg.preset}' if cfg.preset else 'defaults'}, {rates}, spec {cfg.spec}" + "".join(
            f", {k} {v}" for k, v in cfg.symo_options.items())
        print(f"symo train: {cfg.optimizer} ({symo if cfg.optimizer == 'symo' else rates}), "
              f"GPT {cfg.n_layer}x{cfg.n_embd} ({cfg.n_head} heads, {run.n_params / 1e6:.2f}M parameters), "
              f"{run.data_name} ({run.n_chars:,} chars, vocabulary {run.vocab_size}), batch {cfg.batch_size}x"
              f"{cfg.block_size}, {run.world} process(es) on {cfg.device}\nrun folder: {run.run_dir}"
              + (f" (resumed at step {run.start_step} of {cfg.steps})" if run.resumed else ""), flush=True)
        end = run.schedule_steps
        if end is not None and end < cfg.steps:  # a resume with a larger --steps
            rates = f"lr {cfg.lr * cfg.min_lr_ratio:g}" + (f", adamw-lr {cfg.adamw_lr * cfg.min_lr_ratio:g}"
                                                           if cfg.optimizer != "adamw" else "")
            print(f"extended to {cfg.steps} steps: the learning-rate schedule keeps its {end} steps (warm-up, cosine "
                  f"decay), and steps {end + 1} to {cfg.steps} run at the rate its cosine ends at, --min-lr-ratio "
                  f"{cfg.min_lr_ratio:g} x the rate ({rates})", flush=True)
        if run.step_cost is not None and run.step_cost.ratio > SHOWN_ABOVE:
            print(run.step_cost.line() + cost_advice(cfg), flush=True)
        self.bar = progress(total=cfg.steps, initial=run.start_step, disable=not self.show_bar, unit="step",
                            dynamic_ncols=True)

    def wants_step_cost(self) -> bool:
        return True

    def stepped(self, report: StepReport) -> None:
        self.bar.set_postfix_str(f"loss {report.row['train_loss']:.3f} val {report.last_val:.3f} "
                                 f"{report.tokens_per_s:,.0f} tok/s", refresh=False)
        self.bar.update(1)

    def finished(self, interrupted: TrainInterrupted | None) -> None:
        if self.bar is not None:
            self.bar.close()
        if interrupted is not None:
            print(f"\n{interrupted}", flush=True)


def cost_advice(cfg: TrainConfig) -> str:
    """What follows the expected-cost line: how to make the step cheaper, where the run has a knob for it."""
    where = "docs/training.md, 'The cost of a step'"
    every = cfg.precondition_frequency
    if every is None and cfg.preset is not None:
        every = get_preset(cfg.preset).values.get("precondition_frequency")
    if every is None or every >= 10:
        return f" ({where})"
    now = "at every step" if every == 1 else f"every {every} steps"
    if cfg.preset == "published" and every < 3:
        return (f". The preset recomputes its factors {now}; --precondition-frequency 3 recomputes them every third "
                "step (on the default GPT: 2.3x AdamW's step and the same validation loss after 200 steps, where 10 "
                f"steps apart trained worse; {where})")
    return (f". The preset recomputes its factors {now}; --precondition-frequency N recomputes them every N steps, "
            f"cheaper and staler ({where})")
