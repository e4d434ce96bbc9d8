"""nanoGPT on character Shakespeare: AdamW, Muon, Symo (Muon-style spec) and Symo (true-symmetry spec).

Same model, data, batch, schedule (warm-up + cosine) and step budget for every optimizer. Protocol:
1. Learning rates: per optimizer, a grid of full-length runs (seed 0) scored by the final validation loss;
   a best rate at the edge of its grid extends the grid by one point in that direction (up to twice).
2. The chosen rate is run on two more seeds (1, 2; seed 0 is the grid run): 3 seeds in all.
3. Target = the worst AdamW seed's final validation loss (so every AdamW seed reaches it); steps to
   target = the first evaluation step at or below it.
4. ms/step: all optimizers timed in one process, interleaved rounds of forward + backward + step on
   the same batch (1 thread), as ratios to AdamW.

    python -m benchmarks.nanogpt_compare            # writes benchmarks/results/nanogpt_compare.{md,json,png}
    python -m benchmarks.nanogpt_compare --reference  # the reference size: nanogpt_compare_reference.*
    python -m benchmarks.nanogpt_compare --quick    # a smoke run (a tiny GPT, 10 steps), to a temp dir

Setup (SETUP below): the 4-layer GPT (4 heads, d_model 128) at context 64 and batch 16 (a quarter of the
reference 128 x 32 tokens per step, to fit a shared 2-core machine), 500 steps. `--reference` runs the
reference size (context 128, batch 32, 1000 steps; about 4x the CPU time) and writes its own files.
Runs go to the harness's process pool (benchmarks/harness.py; default 2 workers, 1 thread each). Every
finished run, and the ms/step timing, goes to its run cache, nanogpt_compare_runs.json beside the outputs:
an interrupted comparison continues where it stopped, and a finished one rebuilds its report without
training.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import RunCache, RunPool, interleaved_ms_per_step, write_results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NAME = "nanogpt_compare"
SETUP = {"steps": 500, "batch_size": 16, "block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128,
         "eval_interval": 20, "eval_batches": 4, "warmup": 20,
         "adamw_lr": 3e-3}  # Muon / Symo: the AdamW rate of embeddings, gains and biases
REFERENCE_SETUP = dict(SETUP, steps=1000, batch_size=32, block_size=128)
QUICK_SETUP = {"steps": 10, "batch_size": 4, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32,
               "eval_interval": 5, "eval_batches": 1, "warmup": 2, "adamw_lr": 3e-3}
TIMING_ROUNDS = 5
# What the committed full run was made under and what it shows; written into the md of full runs.
SMALL_NOTES = (
    "**Budget and deviations.** The reference setup is batch 32 x context 128 for 1000 steps. On a 2-core "
    "CPU machine with 30 runs to train, we kept the reference model (4 layers, 4 heads, d_model 128) but used "
    "context 64 and batch 16 (1,024 tokens per step, a quarter of the reference) and 500 steps. Learning rates: "
    "a 3-point grid (factor 2) per optimizer, seed 0, full-length 500-step runs, scored by the final validation "
    "loss; every chosen rate is inside its grid. Then seeds 1 and 2 at the chosen rate (3 seeds in all). Runs "
    "went to 2 worker processes, 1 thread each. Muon and Symo use AdamW at 3e-3 (not tuned) for embeddings, "
    "LayerNorm gains and biases; AdamW alone uses its tuned rate everywhere. Steps to target are counted at the "
    "evaluations (every 20 steps). The notebook preset (averaged S_g: EMA 0.95 of the raw gradient's block "
    "statistics, no momentum, no damping, float64 statistics, natural scale) has Adam-like rates, so its grid "
    "is AdamW's.",
    "",
    "**Reading.** Muon reaches the target in 0.36x AdamW's steps. Symo with the Muon-style spec and its "
    "defaults (Muon's step) ties Muon: final loss 1.8454 against 1.8462, 140 steps to target against 127 (one "
    "20-step evaluation). The true-symmetry spec with the same step is 0.016 behind. The notebook preset, Symo's "
    "averaged curvature, loses here: 1.9077 (Muon-style spec) and 1.8951 (true-symmetry spec) against Muon's "
    "1.8462, about one seed spread behind, although the true-symmetry spec reaches the target as early as Muon "
    "(133 steps). Two reasons, as on the other minibatch benchmarks (docs/where_symmetry_helps.md): the preset "
    "has no momentum, and the averaged statistic whitens the minibatch noise as faithfully as the signal. "
    "Within the preset the true symmetry beats the Muon-style spec (1.8951 against 1.9077), the reverse of the "
    "momentum step. Its cost on CPU: the notebook preset stores each block's mult x mult statistic and takes its "
    "float64 inverse square root every step, 3.3x (Muon-style spec) and 6.8x (true-symmetry spec) AdamW's "
    "time per step, against Muon's 1.4x.",
)
REFERENCE_NOTES = (
    "**Budget.** The reference setup as specified: batch 32 x context 128 (4,096 tokens per step), 1000 steps, "
    "the same model and the same tuning as the small run (3-point grid, factor 2, per optimizer, seed 0, "
    "full-length 1000-step runs scored by final validation loss; every chosen rate inside its grid; then seeds 1 "
    "and 2). 2 worker processes, 1 thread each. Muon and Symo use AdamW at 3e-3 (not tuned) for embeddings, "
    "LayerNorm gains and biases.",
    "",
    "**Reading.** Muon reaches the target in 0.47x AdamW's steps, and Symo with its defaults and the Muon-style "
    "spec (Muon's step) ties it: 1.5542 against 1.5520, inside one seed spread; the true-symmetry spec with the "
    "same step is 0.011 behind. The notebook preset loses by more than one seed spread: 1.6102 (Muon-style spec) "
    "and 1.6322 (true-symmetry spec) against Muon's 1.5520, 0.058 and 0.080 behind, and 1.3x and 1.4x Muon's "
    "steps to the target. Unlike the small run, the Muon-style spec beats the true symmetry within the preset "
    "too, by 0.022, more than the seed spread; we have not isolated why (the run changes batch, context and "
    "length at once). Cost: the preset "
    "takes each block's float64 inverse square root every step, 1.7x (Muon-style spec) and 2.5x (true-symmetry "
    "spec) AdamW's time per step, against Muon's 1.15x.",
)
NOTES = {NAME: SMALL_NOTES, f"{NAME}_reference": REFERENCE_NOTES}
# every run is without weight decay (the comparison tunes the rate alone; symo train's default decay came later)
VARIANTS = {
    "adamw": {"optimizer": "adamw", "weight_decay": 0.0},
    "muon": {"optimizer": "muon", "weight_decay": 0.0},
    # Symo's defaults (Muon's step; preset None), which these runs measured before symo train's default preset
    "symo_muon": {"optimizer": "symo", "spec": "gpt_muon", "preset": None, "weight_decay": 0.0},
    "symo_true": {"optimizer": "symo", "spec": "gpt_true", "preset": None, "weight_decay": 0.0},
    # the notebook preset: averaged S_g (EMA 0.95 of the raw gradient's block statistics), no momentum,
    # natural scale (Adam-like rates), so its rates get their own grid
    "symo_muon_notebook": {"optimizer": "symo", "spec": "gpt_muon", "preset": "notebook", "weight_decay": 0.0},
    "symo_true_notebook": {"optimizer": "symo", "spec": "gpt_true", "preset": "notebook", "weight_decay": 0.0},
}
GRIDS = {  # learning rate of the hidden matrices (AdamW: of every parameter)
    "adamw": [2e-3, 4e-3, 8e-3],
    "muon": [0.01, 0.02, 0.04],
    "symo_muon": [0.01, 0.02, 0.04],
    "symo_true": [0.01, 0.02, 0.04],
    "symo_muon_notebook": [2e-3, 4e-3, 8e-3],
    "symo_true_notebook": [2e-3, 4e-3, 8e-3],
}
LABELS = {"adamw": "AdamW", "muon": "Muon", "symo_muon": "Symo, Muon-style spec (gpt_muon)",
          "symo_true": "Symo, true-symmetry spec (gpt_true)",
          "symo_muon_notebook": "Symo notebook preset, Muon-style spec (gpt_muon)",
          "symo_true_notebook": "Symo notebook preset, true-symmetry spec (gpt_true)"}


def run_one(job: dict) -> dict:
    """One training run in a worker process (1 thread)."""
    import torch

    from symo.train import TrainConfig, train

    cfg = TrainConfig(**job["config"], progress=False, sample_chars=0,
                      out_dir=str(Path(job["run_root"]) / job["key"].replace("/", "_")))
    ckpt = Path(cfg.out_dir) / "ckpt.pt"
    if ckpt.exists():
        ckpt.unlink()  # a half-finished earlier attempt: start over
    threads = torch.get_num_threads()  # with one worker the run trains in the calling process
    torch.set_num_threads(1)
    t = time.perf_counter()
    try:
        res = train(cfg)
    finally:
        torch.set_num_threads(threads)
    h = res["history"]
    evals = [(int(s), v) for s, v in zip(h["step"], h["val_loss"]) if not math.isnan(v)]
    return {"key": job["key"], "variant": job["variant"], "lr": job["config"]["lr"], "seed": job["config"]["seed"],
            "final_val": res["final_val"], "evals": evals, "ms_per_step_in_run": res["ms_per_step"],
            "wall_s": time.perf_counter() - t}


def job_for(variant: str, lr: float, seed: int, args: argparse.Namespace) -> dict:
    config = dict(VARIANTS[variant], lr=lr, seed=seed, steps=args.steps, batch_size=args.batch_size,
                  block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                  eval_interval=args.eval_interval, eval_batches=args.eval_batches, warmup=args.warmup,
                  adamw_lr=args.adamw_lr)
    size = f"{args.n_layer}x{args.n_embd}h{args.n_head}b{args.batch_size}t{args.block_size}s{args.steps}"
    return {"key": f"{variant}/lr{lr:g}/seed{seed}/{size}/e{args.eval_interval}w{args.warmup}a{args.adamw_lr:g}",
            "variant": variant, "config": config, "run_root": args.run_root}


def choose_lr(results: dict[float, float], grid: list[float]) -> tuple[float, float | None]:
    """Best rate by final validation loss; the next rate to try when the best is at the grid's edge."""
    best = min(results, key=lambda lr: (results[lr], lr))
    ordered = sorted(grid)
    if best == ordered[0]:
        return best, ordered[0] / 2
    if best == ordered[-1]:
        return best, ordered[-1] * 2
    return best, None


def timing(args: argparse.Namespace, lrs: dict[str, float], rounds: int = 5, steps: int = 4) -> dict[str, float]:
    """Median ms per (forward + backward + step) per optimizer, interleaved rounds in this process."""
    import torch

    torch.set_num_threads(1)
    from symo.train import TrainConfig, build_optimizer
    from symo.train.data import load_corpus
    from symo.train.models import GPT, GPTConfig

    corpus = load_corpus(None)
    x, y = corpus.batch("train", 0, args.batch_size, args.block_size, 0)
    setups = {}
    for v in lrs:
        cfg = TrainConfig(**VARIANTS[v], lr=lrs[v], n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                          block_size=args.block_size, batch_size=args.batch_size)
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=args.block_size, vocab_size=corpus.vocab_size, n_layer=args.n_layer,
                              n_head=args.n_head, n_embd=args.n_embd))
        setups[v] = (model, build_optimizer(model, cfg))
    return interleaved_ms_per_step(setups, x, y, rounds, steps)


def steps_to(evals: list[tuple[int, float]], target: float) -> int | None:
    return next((s for s, v in evals if v <= target), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny GPT, 10 steps, two rates, 2 seeds, to a temp dir")
    p.add_argument("--reference", action="store_true",
                   help="the reference size (context 128, batch 32, 1000 steps), to nanogpt_compare_reference.*")
    p.add_argument("--steps", type=int, default=None, help=f"training steps per run (default {SETUP['steps']})")
    p.add_argument("--seeds", type=int, default=None, help="seeds at the chosen rate, the grid's seed 0 included (3)")
    p.add_argument("--workers", type=int, default=2, help="processes for the missing runs (one thread each)")
    p.add_argument("--out", type=Path, default=None, help="folder of the outputs and the run cache")
    args = p.parse_args(argv)
    if args.quick and args.reference:
        p.error("--quick and --reference are two different sizes; give one")
    command = "python -m benchmarks.nanogpt_compare" + "".join(
        f" --{k}" for k in ("quick", "reference") if getattr(args, k)) + "".join(
        f" --{k} {getattr(args, k)}" for k in ("steps", "seeds") if getattr(args, k) is not None)
    args.name = f"{NAME}_reference" if args.reference else NAME
    for key, value in (QUICK_SETUP if args.quick else REFERENCE_SETUP if args.reference else SETUP).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.seeds = args.seeds or (2 if args.quick else 3)
    args.out = args.out or (Path(tempfile.mkdtemp(prefix="nanogpt_compare_")) if args.quick else RESULTS)
    args.run_root = tempfile.mkdtemp(prefix="nanogpt_compare_runs_")  # checkpoints, not kept
    variants = list(VARIANTS)
    grids = {v: list(GRIDS[v][1:] if args.quick else GRIDS[v]) for v in variants}

    args.out.mkdir(parents=True, exist_ok=True)
    cache = RunCache(args.out / f"{args.name}_runs.json")
    t_start = time.time()
    grid_done: dict[str, dict[float, float]] = {v: {} for v in variants}
    extensions = {v: 0 for v in variants}
    chosen: dict[str, float] = {}
    runs: dict[str, dict] = {}
    pool = RunPool(run_one, cache, workers=args.workers, desc=args.name)

    def submit(variant: str, lr: float, seed: int) -> None:
        pool.submit(job_for(variant, lr, seed, args))

    def on_done(job: dict, res: dict) -> None:
        runs[res["key"]] = res
        v = res["variant"]
        if res["seed"] == 0 and v not in chosen:
            grid_done[v][res["lr"]] = res["final_val"]
            if len(grid_done[v]) == len(grids[v]):
                best, extra = choose_lr(grid_done[v], grids[v])
                if extra is not None and extensions[v] < 2 and not args.quick:
                    extensions[v] += 1
                    grids[v].append(extra)
                    submit(v, extra, 0)
                else:
                    chosen[v] = best
                    for seed in range(1, args.seeds):
                        submit(v, best, seed)

    for v in reversed(variants):  # the slowest (notebook preset) first, so that the pool's tail is short
        for lr in list(grids[v]):
            submit(v, lr, 0)
    pool.run(on_done)
    print(f"{(time.time() - t_start) / 60:.1f} minutes of training", flush=True)
    timing_key = "timing/" + job_for("adamw", 0.0, 0, args)["key"].split("/", 3)[3] + "/" + ",".join(
        f"{v}={chosen[v]:g}" for v in variants)
    if timing_key not in cache:
        print("timing the optimizers (interleaved rounds) ...", flush=True)
        cache.put(timing_key, {"ms_per_step": timing(args, chosen, rounds=1 if args.quick else TIMING_ROUNDS)})
    report(args, variants, grid_done, chosen, runs, cache[timing_key]["ms_per_step"], command)
    shutil.rmtree(args.run_root, ignore_errors=True)
    return 0


def report(args, variants, grid_done, chosen, runs, ms, command) -> None:
    def seed_runs(v: str) -> list[dict]:
        out = []
        for seed in range(args.seeds):
            key = job_for(v, chosen[v], seed, args)["key"]
            if key in runs:
                out.append(runs[key])
        return out

    target = max(r["final_val"] for r in seed_runs("adamw"))
    summary = {}
    for v in variants:
        rs = seed_runs(v)
        finals = [r["final_val"] for r in rs]
        reach = [steps_to(r["evals"], target) for r in rs]
        summary[v] = {
            "lr": chosen[v], "grid": {f"{lr:g}": grid_done[v][lr] for lr in sorted(grid_done[v])},
            "val_final_mean": statistics.mean(finals),
            "val_final_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "val_finals": finals, "steps_to_target": reach,
            "steps_to_target_mean": statistics.mean(reach) if all(s is not None for s in reach) else None,
            "ms_per_step": ms[v], "ms_per_step_in_run_median": statistics.median(r["ms_per_step_in_run"] for r in rs),
            "seeds": [r["seed"] for r in rs],
        }
    base_steps = summary["adamw"]["steps_to_target_mean"]
    worker_minutes = sum(r["wall_s"] for r in runs.values()) / 60
    out = {"target": target, "optimizers": summary,
           "setup": {k: getattr(args, k) for k in ("steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd",
                                                   "eval_interval", "eval_batches", "warmup", "adamw_lr", "seeds")},
           "command": command, "worker_minutes": worker_minutes}

    def fmt_steps(v):
        s = summary[v]
        reached = sum(x is not None for x in s["steps_to_target"])
        if s["steps_to_target_mean"] is None:
            return f"not reached ({reached}/{len(s['steps_to_target'])} seeds)", "-"
        ratio = f"{s['steps_to_target_mean'] / base_steps:.2f}x" if base_steps else "-"
        return f"{s['steps_to_target_mean']:.0f}", ratio

    lines = [f"# nanoGPT on Shakespeare: AdamW, Muon and Symo ({args.steps} steps)", "",
             f"Command: `{command}` ({len(runs)} runs, {worker_minutes:.0f} worker-minutes of training on "
             "the shared 2-core machine).", "",
             f"Model: GPT {args.n_layer} layers, {args.n_head} heads, d_model {args.n_embd}, "
             f"context {args.block_size}; "
             f"batch {args.batch_size}; {args.steps} steps, {args.warmup} warm-up then cosine to 10%; "
             f"validation = {args.eval_batches} fixed batches every {args.eval_interval} steps. "
             f"Target = worst AdamW seed's final validation loss = **{target:.4f}**.", ""]
    if not args.quick and NOTES[args.name]:
        lines += [*NOTES[args.name], ""]
    lines += [
             "| optimizer | lr | final val (mean ± std over seeds) | seeds | steps to target | "
             "vs AdamW steps | ms/step | vs AdamW time |", "|---|---|---|---|---|---|---|---|"]
    for v in variants:
        s = summary[v]
        steps, ratio = fmt_steps(v)
        lines.append(f"| {LABELS[v]} | {s['lr']:g} | {s['val_final_mean']:.4f} ± {s['val_final_std']:.4f} | "
                     f"{len(s['seeds'])} | {steps} | "
                     f"{ratio} | {s['ms_per_step']:.0f} | {s['ms_per_step'] / ms['adamw']:.2f}x |")
    lines += ["", "Learning-rate grids (seed 0, full-length runs, final validation loss; * = chosen):", "",
              "| optimizer | " + " | ".join(["rate: final val"]) + " |", "|---|---|"]
    for v in variants:
        cells = ", ".join(f"{lr:g}{'*' if lr == chosen[v] else ''}: {grid_done[v][lr]:.4f}"
                          for lr in sorted(grid_done[v]))
        lines.append(f"| {LABELS[v]} | {cells} |")
    lines += ["", "ms/step: forward + backward + optimizer step, median over interleaved rounds in one process with "
              "1 thread, after the training runs; absolute times depend on the machine, the ratios less so.", ""]
    write_results(args.out, args.name, "\n".join(lines), out)
    plot(args, variants, summary, runs, chosen, target, seed_runs)
    print("\n".join(lines))


def plot(args, variants, summary, runs, chosen, target, seed_runs) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for v in variants:
        rs = seed_runs(v)
        steps = [s for s, _ in rs[0]["evals"]]
        vals = [[dict(r["evals"]).get(s, math.nan) for r in rs] for s in steps]
        mean = [statistics.mean(x) for x in vals]
        line, = ax.plot(steps, mean, label=f"{LABELS[v]} (lr {chosen[v]:g})")
        ax.fill_between(steps, [min(x) for x in vals], [max(x) for x in vals], color=line.get_color(), alpha=0.2)
    ax.axhline(target, color="gray", ls="--", lw=0.8, label=f"target {target:.3f}")
    ax.set_ylim(top=min(3.5, ax.get_ylim()[1]))
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats / char)")
    ax.set_title(f"GPT {args.n_layer}x{args.n_embd}, Shakespeare, batch {args.batch_size}x{args.block_size}: "
                 f"mean of {args.seeds} seeds (band: min-max)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / f"{args.name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
