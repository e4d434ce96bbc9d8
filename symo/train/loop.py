"""`symo train`: train a nanoGPT-shaped character model with Symo, Muon or AdamW.

    symo train                                   # 4-layer GPT on the bundled Shakespeare, Symo (gpt_muon_qkv spec)
    symo train --optimizer adamw --steps 2000 --data my.txt
    torchrun --nproc_per_node 2 -m symo train    # DistributedDataParallel (gloo on CPU, NCCL on GPU)
    torchrun --nproc_per_node 2 -m symo train --fsdp    # FSDP2 (fully_shard)

Under torchrun Symo computes each block's matrix function on one rank (docs/distributed.md).

A run folder holds `log.csv`, `loss.png` and `ckpt.pt`. The checkpoint is written atomically at every
evaluation, at the end and on an interrupt, and `--resume` continues from it bit-identically: batches are
a pure function of (seed, step) and the schedule a function of the step, so nothing else needs restoring.
`train()` prints nothing: it reports to a `TrainObserver` (events.py), which the command line uses to
show the progress and to stop on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..runtime.compiled import NonFiniteGradientError
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .config import DEFAULT_LR, OPTIMIZERS, RESUME_KEYS, TrainConfig, spec_reference
from .cost import measure_step_cost
from .data import Corpus, _mix, load_corpus
from .events import RunStart, StepReport, TrainInterrupted, TrainObserver
from .memory import check_step_fits
from .models import GPT, GPTConfig
from .optimizers import build_optimizer, check_head_sizes, check_symo_options
from .parallel import gather_states, load_states, shard, sharded, wrap
from .rundir import claim_run_folder
from .runlog import write_csv, write_plot

__all__ = ["DEFAULT_LR", "OPTIMIZERS", "RESUME_KEYS", "TrainConfig", "build_optimizer", "lr_factor", "saved_options",
           "train"]

def lr_factor(step: int, cfg: TrainConfig, schedule_steps: int | None = None) -> float:
    """Linear warm-up over `warmup` steps, then cosine from 1 to `min_lr_ratio` at `schedule_steps` (default
    `steps`), and `min_lr_ratio` from there on (the steps a resume with a larger --steps adds)."""
    end = cfg.steps if schedule_steps is None else schedule_steps
    if step >= end:
        return cfg.min_lr_ratio
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(end - cfg.warmup, 1)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _options(cfg: TrainConfig) -> dict[str, Any]:
    """Every option of the run, as the checkpoint stores them for `--resume RUN_DIR` (paths made absolute,
    so a resume from another folder reads the same files)."""
    options = dataclasses.asdict(cfg)
    for key in ("data", "cache_dir"):
        if options[key] is not None:
            options[key] = os.path.abspath(options[key])
    options["spec"] = spec_reference(options["spec"])
    return {k: v for k, v in options.items() if k not in ("resume", "out_dir")}


def saved_options(run_dir: str | Path) -> dict[str, Any]:
    """The options the run in `run_dir` was started with, read from its ckpt.pt: what `symo train --resume
    RUN_DIR` uses for every option not given on the command line."""
    path = Path(run_dir) / "ckpt.pt"
    blob = load_checkpoint(path, {}, map_location="cpu")
    options = blob.get("options")
    if not isinstance(options, dict):
        raise CheckpointError(f"{path}: this checkpoint does not record its run's options (written by an older "
                              f"symo train); resume with --resume --out-dir {run_dir} and the run's options")
    names = {f.name for f in dataclasses.fields(TrainConfig)} - {"resume", "out_dir"}
    return {k: v for k, v in options.items() if k in names}


def _settings(cfg: TrainConfig, corpus: Corpus) -> dict[str, Any]:
    values = dataclasses.asdict(cfg) | {"data": corpus.name, "vocab": corpus.chars, "spec": spec_reference(cfg.spec)}
    return {k: values[k] for k in RESUME_KEYS}


def _distributed(device: str) -> tuple[int, int]:
    """(rank, world): joins the process group when started by torchrun (or with RANK/WORLD_SIZE set)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return dist.get_rank(), dist.get_world_size()


@torch.no_grad()
def evaluate(model: torch.nn.Module, corpus: Corpus, cfg: TrainConfig, rows: slice, device: str) -> float:
    """Mean loss over `eval_batches` fixed validation batches (the same ones at every evaluation)."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64)
    for k in range(cfg.eval_batches):
        x, y = corpus.batch("val", k, cfg.batch_size, cfg.block_size, cfg.seed, rows)
        total += model(x.to(device), y.to(device))[1].double().cpu()
    model.train()
    if dist.is_initialized():
        dist.all_reduce(total)
        total /= dist.get_world_size()
    return float(total) / cfg.eval_batches


@torch.no_grad()
def sample(model: GPT, corpus: Corpus, n_chars: int, seed: int, device: str, temperature: float = 0.8) -> str:
    """Autoregressive sampling from a newline, at `temperature`, with a seeded generator."""
    model.eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    start = corpus.encode("\n") if "\n" in corpus.chars else torch.zeros(1, dtype=torch.long)
    idx = start.view(1, -1).to(device)
    for _ in range(n_chars):
        logits = model(idx[:, -model.config.block_size:])[0][:, -1] / temperature
        idx = torch.cat([idx, torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)], dim=1)
    model.train()
    return corpus.decode(idx[0, start.numel():].tolist())


def train(cfg: TrainConfig, callback: Callable[[int, dict[str, float]], None] | None = None, *,
          observer: TrainObserver | None = None,
          optimizer_factory: Callable[[GPT], torch.optim.Optimizer] | None = None) -> dict[str, Any]:
    """Train; see `_train` (this wrapper restores torch's thread count when `cfg.threads` changed it).

    `optimizer_factory(model)` replaces `build_optimizer` (a benchmark's baseline from another library);
    `cfg.optimizer` then only names the run."""
    previous = torch.get_num_threads()
    try:
        with contextlib.ExitStack() as held:  # the run folder's lock, for the life of the run
            return _train(cfg, callback, observer or TrainObserver(), held, optimizer_factory)
    finally:
        if cfg.threads:
            torch.set_num_threads(previous)


def _train(cfg: TrainConfig, callback: Callable[[int, dict[str, float]], None] | None,
           observer: TrainObserver, held: contextlib.ExitStack,
           optimizer_factory: Callable[[GPT], torch.optim.Optimizer] | None = None) -> dict[str, Any]:
    """Train; returns {"run_dir", "history", "final_val", "ms_per_step", "sample", ...}.

    `callback(step, row)` runs after every step on every process (tests raise KeyboardInterrupt from it to
    stand for Ctrl-C). `observer` sees the run (events.py). On a KeyboardInterrupt, or when the observer
    asks to stop, a checkpoint of the last whole step is written and `TrainInterrupted` (a
    KeyboardInterrupt) raised. The run folder is claimed (rundir.py) until `held` closes; a step that cannot
    fit in memory is refused before anything is built (memory.py).
    """
    _check_device(cfg.device)
    check_symo_options(cfg)
    check_head_sizes(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rank, world = _distributed(cfg.device)
    if cfg.batch_size % world:
        raise ValueError(f"--batch-size {cfg.batch_size} must be divisible by the number of processes ({world})")
    per_rank = cfg.batch_size // world
    rows = slice(rank * per_rank, (rank + 1) * per_rank) if world > 1 else None
    device = cfg.device
    if device.startswith("cuda") and world > 1:
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    corpus = load_corpus(cfg.data, cfg.cache_dir)
    check_step_fits(cfg, corpus.vocab_size, device, world)
    run_dir = _run_dir(cfg, corpus.name, world)
    held.callback(claim_run_folder(run_dir, rank, world).release)
    ckpt_path = run_dir / "ckpt.pt"
    settings = _settings(cfg, corpus)
    blob = None
    schedule_steps = cfg.steps  # the steps the learning-rate schedule spans (fewer in an extended run)
    if cfg.resume:  # --steps may grow: the run is extended (_schedule_steps)
        blob = load_checkpoint(ckpt_path, {k: v for k, v in settings.items() if k != "steps"}, map_location=device)
        schedule_steps = _schedule_steps(ckpt_path, blob, cfg.steps)
    elif ckpt_path.exists():
        raise CheckpointError(f"{ckpt_path} exists: pass --resume to continue that run, or choose another --out-dir "
                              "(the checkpoint was left as it is)")

    torch.manual_seed(cfg.seed)
    model = GPT(GPTConfig(block_size=cfg.block_size, vocab_size=corpus.vocab_size, n_layer=cfg.n_layer,
                          n_head=cfg.n_head, n_embd=cfg.n_embd, bias=cfg.bias)).to(device)
    if sharded(cfg.fsdp, world):
        shard(model)
    opt = build_optimizer(model, cfg, world) if optimizer_factory is None else optimizer_factory(model)
    history: dict[str, list[float]] = {"step": [], "lr": [], "train_loss": [], "val_loss": [], "elapsed_s": []}
    start = 0
    if blob is not None:
        try:
            load_states(model, opt, blob, cfg.fsdp, world)
        except (RuntimeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"{ckpt_path}: does not fit this model / optimizer ({str(exc)[:300]}); "
                                  "the checkpoint was left as it is") from None
        start, history = int(blob["step"]), blob["history"]
    base_lrs = [g["lr"] for g in opt.param_groups] if blob is None else blob["base_lrs"]
    net = wrap(model, cfg.fsdp, world, device)
    if cfg.compile:
        net = torch.compile(net)

    def checkpoint(step: int) -> None:
        model_state, opt_state = gather_states(model, opt, cfg.fsdp, world)  # every rank: may be collective
        if rank == 0:
            save_checkpoint(ckpt_path, {"model": model_state, "optimizer": opt_state, "step": step,
                                        "history": history, "base_lrs": base_lrs, "settings": settings,
                                        "options": _options(cfg), "schedule_steps": schedule_steps})
            write_csv(run_dir / "log.csv", history)

    lead = rank == 0
    step_cost = None  # in one process, when the observer shows it and the optimizer is not AdamW itself
    if world == 1 and observer.wants_step_cost() and (cfg.optimizer != "adamw" or optimizer_factory is not None):
        step_cost = measure_step_cost(model, optimizer_factory or (lambda m: build_optimizer(m, cfg)), cfg.batch_size,
                                      cfg.block_size, corpus.vocab_size, device)
    if lead:
        observer.started(RunStart(config=cfg, run_dir=run_dir, world=world,
                                  n_params=sum(p.numel() for p in model.parameters()), data_name=corpus.name,
                                  n_chars=len(corpus.ids), vocab_size=corpus.vocab_size, start_step=start,
                                  resumed=blob is not None, schedule_steps=schedule_steps, step_cost=step_cost))
    step_times: list[float] = []
    elapsed0 = history["elapsed_s"][-1] if history["elapsed_s"] else 0.0
    t_run = time.perf_counter()
    val = history["val_loss"][-1] if history["val_loss"] else float("nan")
    if start == 0:
        val = evaluate(net, corpus, cfg, rows, device)
        _record(history, 0, float("nan"), float("nan"), val, 0.0)
    clean = True  # the model, optimizer and history agree (no step half done)
    try:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            clean = False
            for g, base in zip(opt.param_groups, base_lrs):
                g["lr"] = base * lr_factor(step, cfg, schedule_steps)
            x, y = corpus.batch("train", step, cfg.batch_size, cfg.block_size, cfg.seed, rows)
            loss = net(x.to(device), y.to(device))[1]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            try:
                opt.step()
            except NonFiniteGradientError as exc:  # say what this loop knows about the batch and the loss
                raise NonFiniteGradientError(_diverged(exc, step + 1, loss, cfg)) from None
            loss = loss.detach()
            if world > 1:
                dist.all_reduce(loss)
                loss /= world
            train_loss = float(loss)
            step_times.append(time.perf_counter() - t0)
            done = step + 1
            val = float("nan")
            if done % cfg.eval_interval == 0 or done == cfg.steps:
                val = evaluate(net, corpus, cfg, rows, device)
            row = _record(history, done, opt.param_groups[0]["lr"], train_loss, val,
                          elapsed0 + time.perf_counter() - t_run)
            clean = True
            if not math.isnan(val):
                checkpoint(done)
            tok_s = cfg.batch_size * cfg.block_size / (sum(step_times[-20:]) / len(step_times[-20:]))
            last_val = next((v for v in reversed(history["val_loss"]) if not math.isnan(v)), float("nan"))
            if lead:
                observer.stepped(StepReport(step=done, row=row, last_val=last_val, tokens_per_s=tok_s))
            if callback is not None:
                callback(done, row)
            if _stop_requested(observer, world):
                raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        done = int(history["step"][-1])
        if clean:
            checkpoint(done)
        interrupted = TrainInterrupted(done, ckpt_path if clean else None, run_dir)
        if lead:
            observer.finished(interrupted)
        raise interrupted from exc
    if lead:
        observer.finished(None)
    result: dict[str, Any] = {"run_dir": run_dir, "history": history, "model": model, "corpus": corpus,
                              "final_val": history["val_loss"][-1], "steps": cfg.steps, "world": world,
                              "ms_per_step": 1e3 * _median(step_times[min(5, len(step_times) - 1):])
                              if step_times else float("nan")}
    # a sharded model's forward needs every rank: each samples the same text (a seeded generator)
    text = sample(model, corpus, cfg.sample_chars, cfg.seed, device) if cfg.sample_chars and (
        rank == 0 or sharded(cfg.fsdp, world)) else ""
    if rank == 0:
        write_csv(run_dir / "log.csv", history)
        result["plot"] = write_plot(run_dir / "loss.png", history, title=f"{cfg.optimizer} on {corpus.name}")
        result["sample"] = text
    return result


def _schedule_steps(path: Path, blob: dict[str, Any], steps: int) -> int:
    """The steps the learning-rate schedule of a resumed run spans: those of the run's first --steps, also
    when `steps` (the --steps now) extends the run. A smaller --steps than the checkpoint's is refused."""
    saved = blob.get("settings", {}).get("steps", "<missing>")
    if not isinstance(saved, int):
        raise CheckpointError(f"{path}: the checkpoint does not record its run's --steps ({saved!r}); start a new run "
                              "with another --out-dir; the checkpoint was left as it is")
    if steps < saved:
        raise CheckpointError(f"{path}: the checkpoint's run has --steps {saved}, and --steps {steps} would shorten "
                              f"it. Leave --steps out to finish the run, give more than {saved} to extend it, or start "
                              "a new run with another --out-dir; the checkpoint was left as it is")
    return int(blob.get("schedule_steps", saved))


def _diverged(exc: NonFiniteGradientError, step: int, loss: torch.Tensor, cfg: TrainConfig) -> str:
    """The optimizer's message about a NaN/inf gradient, with what the loop knows: its batches are token ids
    (integers, never NaN or inf), so the data is ruled out, and this step's loss."""
    value = float(loss.detach())
    return (f"step {step}: {exc}. Here the input batch is token ids (integers, never NaN or inf) and the loss was "
            f"{value:.4g}" + (" (the weights or activations overflowed before the loss)" if not math.isfinite(value)
                              else "")
            + f", so the training diverged: lower --lr ({cfg.lr:g}) or --adamw-lr ({cfg.adamw_lr:g}), or warm up "
            f"longer (--warmup {cfg.warmup})")


def _check_device(device: str) -> None:
    """--device: a torch device this build and machine can use, else a ValueError saying what to do."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {device}: not a torch device; use cpu, cuda or cuda:N") from None
    if kind == "cuda" and not torch.backends.cuda.is_built():
        raise ValueError(f"--device {device}: this torch build has no CUDA (torch {torch.__version__}); install a "
                         "CUDA build of torch (README, GPU users) or use --device cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch has CUDA but sees no GPU (check the driver and "
                         "CUDA_VISIBLE_DEVICES), or use --device cpu")
    if kind not in ("cpu", "cuda"):
        ok = getattr(getattr(torch.backends, kind, None), "is_available", lambda: False)()
        if not ok:
            raise ValueError(f"--device {device}: not available in this torch build / machine; use cpu or cuda")


def _record(history: dict[str, list[float]], step: int, lr: float, train_loss: float, val: float,
            elapsed: float) -> dict[str, float]:
    row = {"step": step, "lr": lr, "train_loss": train_loss, "val_loss": val, "elapsed_s": elapsed}
    for k, v in row.items():
        history[k].append(float(v))
    return row


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if s else float("nan")


def _run_dir(cfg: TrainConfig, data_name: str, world: int) -> Path:
    """--out-dir, or runs/<data>-<optimizer>-<time> decided on rank 0 and shared with the other ranks."""
    if cfg.out_dir:
        return Path(cfg.out_dir)
    if cfg.resume:
        raise CheckpointError("--resume needs the run folder whose ckpt.pt to continue: --resume RUN_DIR")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = [f"runs/{Path(data_name).stem}-{cfg.optimizer}-{stamp}-{_mix(os.getpid()) % 1000:03d}"]
    if world > 1:
        dist.broadcast_object_list(name, src=0)
    return Path(name[0])


def _stop_requested(observer: TrainObserver, world: int) -> bool:
    """Whether any process's observer asks to stop (under several processes the answers are all-reduced,
    so every process stops after the same step)."""
    if world == 1:
        return observer.stop_requested()
    flag = torch.tensor(float(observer.stop_requested()))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag)
