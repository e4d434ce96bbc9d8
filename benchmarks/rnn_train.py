"""A small tanh RNN on the adding problem: Symo with the true RNN symmetry against a Muon-style spec,
Adam and Muon.

    python -m benchmarks.rnn_train [--steps 300] [--length 30] [--hidden 32] [--seeds 3] [--workers 2]

The adding problem (Hochreiter & Schmidhuber 1997): inputs (value ~ U(0, 1), marker) over `length`
steps, one marker in each half; the target is the sum of the two marked values. Predicting the mean
gives MSE 1/6; the target loss is 0.05.

Optimizers (each at its own learning rate, tuned on seed 0 at the reported length over a grid that is
extended while the best rate sits at its edge):
- symo_rnn:  Symo on specs/rnn_tanh.toml (signed_perm hidden units, W_hh as Q W Q^T: a repeated space), natural scale;
- symo_rnn_ema: the same with an EMA of the curvature factors (beta2 = 0.95) instead of one step's;
- symo_rnn_notebook: the same spec with preset="notebook" (EMA 0.95 of the raw gradient's statistics, no
  momentum, no damping, float64 powers);
- symo_rnn_published: the same spec with preset="published" (the published step) at the method's own RNN
  damping, 1e-5 (its grid starts from the method's RNN rate, 1e-3);
- symo_muon: Symo on specs/rnn_muon.toml (a private row space per matrix; biases to its AdamW), Muon scale;
- adam:      torch.optim.Adam;
- muon:      the reference Muon (tests/references.py) on the matrices, AdamW on the biases.
Biases that an optimizer hands to AdamW use lr 1e-3 throughout. An arm named "preset_<name>" is Symo on
specs/rnn_tanh.toml with that preset as it is, "preset_<name>~muon" the same on specs/rnn_muon.toml (its biases go to
Symo's AdamW at the rate that follows lr) (benchmarks/preset_arms.py; benchmarks/lr_transfer.py trains them).

Writes benchmarks/results/rnn_train.{md,json,png}; JSON: optimizers -> name -> lr, loss_final_mean,
loss_final_std, steps_to_target_mean, ms_per_step (plus the grids and per-seed numbers). Every run goes to
a run cache, rnn_train_runs.json beside them (benchmarks/harness.py), so an interrupted invocation
continues where it stopped.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import time
from pathlib import Path

import torch

from benchmarks.harness import RunCache, run_pool, write_results
from benchmarks.preset_arms import preset_options, preset_spec

ROOT = Path(__file__).resolve().parents[1]

TARGET = 0.05
BIAS_LR = 1e-3
GRIDS = {
    "symo_rnn": [1e-3, 3e-3, 1e-2, 3e-2],
    "symo_rnn_ema": [1e-3, 3e-3, 1e-2, 3e-2],
    "symo_rnn_notebook": [1e-3, 3e-3, 1e-2, 3e-2],
    "symo_rnn_published": [3e-4, 1e-3, 3e-3, 1e-2],  # about the method's own RNN rate, 1e-3
    "symo_muon": [5e-3, 1e-2, 2e-2, 5e-2],
    "adam": [1e-3, 3e-3, 1e-2, 3e-2],
    "muon": [5e-3, 1e-2, 2e-2, 5e-2],
}
PRESET_ARMS = {"symo_rnn_notebook": "preset_notebook"}  # the arms that are a Symo preset as it is


def adding_batch(batch: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.rand(batch, length, generator=gen)
    markers = torch.zeros(batch, length)
    half = length // 2
    first = torch.randint(0, half, (batch,), generator=gen)
    second = torch.randint(half, length, (batch,), generator=gen)
    rows = torch.arange(batch)
    markers[rows, first] = 1.0
    markers[rows, second] = 1.0
    target = (values * markers).sum(1, keepdim=True)
    return torch.stack([values, markers], dim=-1), target


def _references():
    spec = importlib.util.spec_from_file_location("symo_test_references", ROOT / "tests" / "references.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_optimizers(name: str, model: torch.nn.Module, lr: float) -> list[torch.optim.Optimizer]:
    import symo

    named = list(model.named_parameters())
    if name == "symo_rnn":
        return [symo.Symo(named, ROOT / "specs" / "rnn_tanh.toml", lr=lr, update_scale="natural")]
    if name == "symo_rnn_ema":
        return [symo.Symo(named, ROOT / "specs" / "rnn_tanh.toml", preconditioner="root", lr=lr,
                          update_scale="natural", beta2=0.95)]
    if name == "symo_rnn_published":  # the published step at the method's own RNN damping
        return [symo.Symo(named, ROOT / "specs" / "rnn_tanh.toml", lr=lr, preset="published", damping=1e-5)]
    options = preset_options(PRESET_ARMS.get(name, name))
    if options is not None:  # a preset as it is (symo_rnn_notebook, preset_<name>; "~muon": on rnn_muon.toml)
        spec = "rnn_muon.toml" if preset_spec(name) == "muon" else "rnn_tanh.toml"
        return [symo.Symo(named, ROOT / "specs" / spec, lr=lr, **options)]
    if name == "symo_muon":
        return [symo.Symo(named, ROOT / "specs" / "rnn_muon.toml", lr=lr, update_scale="muon", adamw_lr=BIAS_LR)]
    if name == "adam":
        return [torch.optim.Adam(model.parameters(), lr=lr)]
    if name == "muon":
        refs = _references()
        mats = [p for _, p in named if p.ndim == 2]
        vecs = [p for _, p in named if p.ndim < 2]
        return [refs.ReferenceMuon(mats, lr=lr), torch.optim.AdamW(vecs, lr=BIAS_LR, weight_decay=0.0)]
    raise ValueError(name)


def _run_job(job: dict) -> dict:
    """One run of the harness's pool."""
    return run(job["job"])


def run(job: tuple) -> dict:
    """One training run; returns the eval curve, the final loss and the time per step."""
    name, lr, seed, steps, length, hidden, batch = job
    torch.set_num_threads(1)
    from symo.train.rnn import RNN

    torch.manual_seed(seed)
    model = RNN(2, hidden, 1, act="tanh")
    opts = make_optimizers(name, model, lr)
    data = torch.Generator().manual_seed(1000 + seed)
    x_eval, y_eval = adding_batch(512, length, torch.Generator().manual_seed(99))
    curve, elapsed = [], 0.0
    every = max(1, steps // 30)
    for step in range(1, steps + 1):
        x, y = adding_batch(batch, length, data)
        t = time.perf_counter()
        for o in opts:
            o.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        for o in opts:
            o.step()
        elapsed += time.perf_counter() - t
        if step % every == 0 or step == steps:
            with torch.no_grad():
                ev = float(((model(x_eval) - y_eval) ** 2).mean())
            curve.append((step, ev if math.isfinite(ev) else float("inf")))
    reached = next((s for s, v in curve if v < TARGET), None)
    return {"name": name, "lr": lr, "seed": seed, "curve": curve, "final": curve[-1][1],
            "steps_to_target": reached, "ms_per_step": 1000 * elapsed / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--length", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    shape = (args.steps, args.length, args.hidden, args.batch)
    out = ROOT / "benchmarks" / "results"
    cache = RunCache(out / "rnn_train_runs.json")

    def runs_of(wanted: list[tuple[str, float, int]], desc: str) -> list[dict]:
        jobs = [{"key": f"{k}/lr{lr!r}/seed{seed}/" + "x".join(map(str, shape)), "job": (k, lr, seed, *shape)}
                for k, lr, seed in wanted]
        return run_pool(_run_job, jobs, cache, args.workers, desc)

    grids = {k: list(v) for k, v in GRIDS.items()}
    tuning: dict[str, dict[float, dict]] = {k: {} for k in grids}
    todo = [(k, lr) for k, v in grids.items() for lr in v]
    while todo:  # tune on seed 0; extend a grid while its best rate is at an edge
        for r in runs_of([(k, lr, 0) for k, lr in todo], "lr tuning"):
            tuning[r["name"]][r["lr"]] = r
        todo = []
        for k in grids:
            lrs = sorted(tuning[k])
            best = min(lrs, key=lambda lr: tuning[k][lr]["final"])
            if best == lrs[0] and len(lrs) < 8:
                todo.append((k, lrs[0] / 3))
            elif best == lrs[-1] and len(lrs) < 8:
                todo.append((k, lrs[-1] * 3))
    chosen = {k: min(tuning[k], key=lambda lr: tuning[k][lr]["final"]) for k in grids}
    runs = {k: [tuning[k][chosen[k]]] for k in grids}
    for r in runs_of([(k, chosen[k], s) for k in grids for s in range(1, args.seeds)], "seeds"):
        runs[r["name"]].append(r)

    summary = {}
    for k, rs in runs.items():
        finals = [r["final"] for r in rs]
        reached = [r["steps_to_target"] for r in rs if r["steps_to_target"] is not None]
        summary[k] = {
            "lr": chosen[k],
            "loss_final_mean": statistics.fmean(finals),
            "loss_final_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "steps_to_target_mean": statistics.fmean(reached) if len(reached) == len(rs) else None,
            "seeds_reaching_target": len(reached),
            "ms_per_step": statistics.fmean(r["ms_per_step"] for r in rs),
            "lr_grid": {str(lr): tuning[k][lr]["final"] for lr in sorted(tuning[k])},
            "finals": finals,
            "steps_to_target": [r["steps_to_target"] for r in rs],
        }
    command = ("python -m benchmarks.rnn_train " + f"--steps {args.steps} --length {args.length} "
               f"--hidden {args.hidden} --batch {args.batch} --seeds {args.seeds} --workers {args.workers}")
    data = {"task": "adding problem", "target_loss": TARGET, "command": command,
            "steps": args.steps, "length": args.length, "hidden": args.hidden, "batch": args.batch,
            "seeds": args.seeds, "optimizers": summary,
            "curves": {k: [r["curve"] for r in rs] for k, rs in runs.items()}}
    lines = [f"Command: `{command}`", "",
             f"Adding problem, tanh RNN (hidden {args.hidden}), sequence length {args.length}, batch "
             f"{args.batch}, {args.steps} steps, {args.seeds} seeds; eval MSE on 512 fixed sequences "
             f"(predicting the mean: 0.167); target {TARGET}. Learning rates tuned on seed 0 at this length; "
             f"1 thread per run, {args.workers} runs in parallel on a shared machine (ms/step is noisy).", "",
             "| optimizer | lr | final eval MSE (mean +- std) | steps to target (mean; seeds reaching) | ms/step |",
             "|---|---|---|---|---|"]
    for k, s in summary.items():
        stt = f"{s['steps_to_target_mean']:.0f}" if s["steps_to_target_mean"] is not None else "-"
        lines.append(f"| {k} | {s['lr']:g} | {s['loss_final_mean']:.4f} +- {s['loss_final_std']:.4f} | "
                     f"{stt} ({s['seeds_reaching_target']}/{args.seeds}) | {s['ms_per_step']:.1f} |")
    lines += ["", "Learning-rate grids (seed 0, final eval MSE):", ""]
    for k, s in summary.items():
        lines.append(f"- {k}: " + ", ".join(f"{lr}: {v:.4f}" for lr, v in s["lr_grid"].items()))
    text = "\n".join(lines)
    write_results(out, "rnn_train", text, data)
    print(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for k, rs in runs.items():
            steps = [s for s, _ in rs[0]["curve"]]
            mean = [statistics.fmean(r["curve"][i][1] for r in rs) for i in range(len(steps))]
            ax.plot(steps, mean, label=f"{k} (lr {chosen[k]:g})")
        ax.axhline(TARGET, color="gray", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("eval MSE (mean over seeds)")
        ax.set_title(f"adding problem, T={args.length}, tanh RNN h={args.hidden}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "rnn_train.png", dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot")


if __name__ == "__main__":
    main()
