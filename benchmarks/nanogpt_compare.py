"""nanoGPT on character Shakespeare: AdamW, Muon, Symo (Muon-style spec) and Symo (true-symmetry spec).

Same model, data, batch, schedule (warm-up + cosine) and step budget for every optimizer. Protocol:
1. Learning rates: per optimizer, a grid of full-length runs (seed 0) scored by the final validation loss;
   a best rate at the edge of its grid extends the grid by one point in that direction (up to twice).
2. The chosen rate is run on two more seeds (1, 2; seed 0 is the grid run): 3 seeds in all.
3. Target = the worst AdamW seed's final validation loss (so every AdamW seed reaches it); steps to
   target = the first evaluation step at or below it.
4. ms/step: all optimizers timed in one process, interleaved rounds of forward + backward + step on
   the same batch (1 thread), as ratios to AdamW.

    python benchmarks/nanogpt_compare.py --seeds 3        # writes benchmarks/results/nanogpt_compare.{md,json,png}
    python benchmarks/nanogpt_compare.py --steps 200 --quick-grid   # a smoke run

Defaults: the issue's model (4 layers, 4 heads, d_model 128) at context 64 and batch 16 (a quarter of
the issue's 128 x 32 tokens per step, to fit a shared 2-core machine), 500 steps.
Runs go to a process pool (default 2 workers, 1 thread each); finished runs are cached in
--cache (JSON), so an interrupted comparison continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = {
    "adamw": {"optimizer": "adamw"},
    "muon": {"optimizer": "muon"},
    "symo_muon": {"optimizer": "symo", "spec": "gpt_muon"},
    "symo_true": {"optimizer": "symo", "spec": "gpt_true"},
}
GRIDS = {  # learning rate of the hidden matrices (AdamW: of every parameter)
    "adamw": [2e-3, 4e-3, 8e-3],
    "muon": [0.01, 0.02, 0.04],
    "symo_muon": [0.01, 0.02, 0.04],
    "symo_true": [0.01, 0.02, 0.04],
}
LABELS = {"adamw": "AdamW", "muon": "Muon", "symo_muon": "Symo, Muon-style spec (gpt_muon)",
          "symo_true": "Symo, true-symmetry spec (gpt_true)"}


def run_one(job: dict) -> dict:
    """One training run in a worker process (1 thread)."""
    import torch

    torch.set_num_threads(1)
    from symo.train import TrainConfig, train

    cfg = TrainConfig(**job["config"], progress=False, sample_chars=0,
                      out_dir=str(Path(job["run_root"]) / job["key"].replace("/", "_")))
    ckpt = Path(cfg.out_dir) / "ckpt.pt"
    if ckpt.exists():
        ckpt.unlink()  # a half-finished earlier attempt: start over
    t = time.perf_counter()
    res = train(cfg)
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
    times: dict[str, list[float]] = {v: [] for v in lrs}
    for r in range(rounds + 1):
        for v, (model, opt) in setups.items():
            for _ in range(steps):
                t = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                model(x, y)[1].backward()
                opt.step()
                if r:  # round 0 warms up
                    times[v].append(time.perf_counter() - t)
    return {v: 1e3 * statistics.median(t) for v, t in times.items()}


def steps_to(evals: list[tuple[int, float]], target: float) -> int | None:
    return next((s for s, v in evals if v <= target), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--eval-interval", type=int, default=20)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--adamw-lr", type=float, default=3e-3, help="Muon / Symo: AdamW rate of embeddings, gains, biases")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--quick-grid", action="store_true", help="two rates per optimizer (smoke runs)")
    p.add_argument("--cache", default=str(ROOT / "runs" / "nanogpt_compare" / "cache.json"))
    p.add_argument("--run-root", default=str(ROOT / "runs" / "nanogpt_compare"))
    p.add_argument("--name", default="nanogpt_compare")
    p.add_argument("--timing-rounds", type=int, default=5)
    p.add_argument("--reuse-timing", action="store_true",
                   help="with --report-only: take ms/step from the existing results JSON instead of timing again")
    p.add_argument("--note", default="", help="a paragraph added to the markdown (e.g. the budget and why)")
    p.add_argument("--report-only", action="store_true",
                   help="no new runs: report from the cached runs (best grid rate, the seeds finished so far)")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "adamw" not in variants:
        p.error(f"--variants: unknown {unknown}; choose from {list(VARIANTS)} (adamw is needed for the target)")
    grids = {v: list(GRIDS[v][1:] if args.quick_grid else GRIDS[v]) for v in variants}

    from tqdm import tqdm

    cache_path = Path(args.cache)
    cache: dict[str, dict] = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    t_start = time.time()
    grid_done: dict[str, dict[float, float]] = {v: {} for v in variants}
    extensions = {v: 0 for v in variants}
    chosen: dict[str, float] = {}
    runs: dict[str, dict] = {}
    pending: dict = {}
    bar = tqdm(total=sum(len(g) for g in grids.values()) + len(variants) * (args.seeds - 1), unit="run")
    pool = ProcessPoolExecutor(max_workers=args.workers, mp_context=get_context("spawn"))

    def submit(variant: str, lr: float, seed: int) -> None:
        job = job_for(variant, lr, seed, args)
        if job["key"] in cache:
            on_done(cache[job["key"]])
        else:
            pending[pool.submit(run_one, job)] = job

    def on_done(res: dict) -> None:
        runs[res["key"]] = res
        bar.update(1)
        bar.set_postfix_str(f"{res['variant']} lr {res['lr']:g} seed {res['seed']}: val {res['final_val']:.3f}")
        v = res["variant"]
        if res["seed"] == 0 and v not in chosen:
            grid_done[v][res["lr"]] = res["final_val"]
            if len(grid_done[v]) == len(grids[v]):
                best, extra = choose_lr(grid_done[v], grids[v])
                if extra is not None and extensions[v] < 2 and not args.quick_grid:
                    extensions[v] += 1
                    grids[v].append(extra)
                    bar.total += 1
                    submit(v, extra, 0)
                else:
                    chosen[v] = best
                    for seed in range(1, args.seeds):
                        submit(v, best, seed)

    if args.report_only:
        pool.shutdown()
        for res in cache.values():
            same_setup = res["key"] == job_for(res["variant"], res["lr"], res["seed"], args)["key"]
            if res["variant"] in variants and same_setup:
                runs[res["key"]] = res
                if res["seed"] == 0:
                    grid_done[res["variant"]][res["lr"]] = res["final_val"]
        for v in variants:
            chosen[v] = choose_lr(grid_done[v], sorted(grid_done[v]))[0]
    for v in variants:
        for lr in list(grids[v]) if not args.report_only else []:
            submit(v, lr, 0)
    while pending:
        done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
        for fut in done:
            job = pending.pop(fut)
            res = fut.result()
            cache[job["key"]] = res
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            os.replace(tmp, cache_path)
            on_done(res)
    pool.shutdown()
    bar.close()
    train_minutes = (time.time() - t_start) / 60
    print("timing the optimizers (interleaved rounds) ...", flush=True)
    old = RESULTS / f"{args.name}.json"
    if args.report_only and args.reuse_timing and old.is_file():
        ms = {v: o["ms_per_step"] for v, o in json.loads(old.read_text())["optimizers"].items()}
    else:
        ms = timing(args, chosen, rounds=args.timing_rounds)
    report(args, variants, grids, grid_done, chosen, runs, ms, train_minutes, argv)
    return 0


def report(args, variants, grids, grid_done, chosen, runs, ms, train_minutes, argv) -> None:
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
    argv = list(argv if argv is not None else sys.argv[1:])
    if "--note" in argv:  # the note is printed on its own; the command shows what made the runs
        i = argv.index("--note")
        del argv[i:i + 2]
    argv = [a for a in argv if a not in ("--report-only", "--reuse-timing")]
    command = "python benchmarks/nanogpt_compare.py " + " ".join(argv)
    worker_minutes = sum(r["wall_s"] for r in runs.values()) / 60
    out = {"target": target, "optimizers": summary,
           "setup": {k: getattr(args, k) for k in ("steps", "batch_size", "block_size", "n_layer", "n_head", "n_embd",
                                                   "eval_interval", "eval_batches", "warmup", "adamw_lr", "seeds")},
           "command": command.strip(), "wall_minutes": train_minutes, "worker_minutes": worker_minutes}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(out, indent=1))

    def fmt_steps(v):
        s = summary[v]
        reached = sum(x is not None for x in s["steps_to_target"])
        if s["steps_to_target_mean"] is None:
            return f"not reached ({reached}/{len(s['steps_to_target'])} seeds)", "-"
        ratio = f"{s['steps_to_target_mean'] / base_steps:.2f}x" if base_steps else "-"
        return f"{s['steps_to_target_mean']:.0f}", ratio

    lines = [f"# nanoGPT on Shakespeare: AdamW, Muon and Symo ({args.steps} steps)", "",
             f"Command: `{command.strip()}` ({len(runs)} runs, {worker_minutes:.0f} worker-minutes of training on "
             "the shared 2-core machine" + (", report rebuilt from the cached runs" if args.report_only else "")
             + ").", "",
             f"Model: GPT {args.n_layer} layers, {args.n_head} heads, d_model {args.n_embd}, "
             f"context {args.block_size}; "
             f"batch {args.batch_size}; {args.steps} steps, {args.warmup} warm-up then cosine to 10%; "
             f"validation = {args.eval_batches} fixed batches every {args.eval_interval} steps. "
             f"Target = worst AdamW seed's final validation loss = **{target:.4f}**.", ""]
    if args.note:
        lines += [args.note, ""]
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
              "1 thread; the machine was shared with other jobs, so absolute times are noisy, the ratios less so.", ""]
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines))
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
    fig.savefig(RESULTS / f"{args.name}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
