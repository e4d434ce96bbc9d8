"""A fused matrix as one matrix or as its pieces: the two Muon-style relaxations `symo infer` writes, trained.

    python -m benchmarks.fused_pieces [--seeds 6] [--workers 2]   # 114 runs of a few seconds (about 4 min)

`relax="muon"` (what `symo.Symo(model)` infers) gives every hidden matrix one block; `relax="muon_pieces"` gives
each piece of a fused matrix its own (`nn.MultiheadAttention`'s in_proj_weight as query, key and value). The
model is symo.train.models_recurrence's small transformer (2 blocks of nn.MultiheadAttention, d_model 32) on its
noisy recurrence, 300 steps. Arms: Muon's step (`preset="muon"`) and SOAP-Muon (`preset="soap_muon"`), each on
both relaxations, over a learning-rate grid that is extended while the best rate (lowest mean over the seeds) is
at an edge; AdamW over (3e-3, 1e-2, 3e-2) for scale. Every seed draws its own initialization and batches, the
same for every arm. `pieces - whole` is the paired 95% interval over seeds, at each relaxation's own best rate
and at the preset's documented rate.

Writes benchmarks/results/fused_pieces.{md,json}; JSON: arms -> name -> {grid: {lr: mean}, lr, mean, std,
finals}, and pairs -> preset -> {tuned, at_preset_lr} intervals. Runs go to fused_pieces_runs.json beside them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import symo
from benchmarks.harness import RunCache, mean_std, paired_diff_ci95, run_pool, write_results
from symo.train.models_recurrence import TinyTransformer, train_recurrence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NAME = "fused_pieces"
PRESETS = ("muon", "soap_muon")
RELAXATIONS = ("muon", "muon_pieces")
SYMO_GRID = (0.01, 0.02, 0.04, 0.08)
ADAMW_GRID = (3e-3, 1e-2, 3e-2)
LABELS = {"muon": "whole matrices (relax muon, Symo(model)'s)", "muon_pieces": "pieces (relax muon_pieces)"}


def _run(job: dict) -> dict:
    """One training run: job["arm"] = (preset or "adamw", relaxation or None), lr, seed."""
    torch.set_num_threads(1)
    (preset, relax), lr, seed = job["arm"], job["lr"], job["seed"]
    if preset == "adamw":
        def make(m):
            return torch.optim.AdamW(m.parameters(), lr=lr)
    else:
        spec = symo.infer_spec(TinyTransformer(), relax=relax)

        def make(m):
            return symo.Symo(m, spec, preset=preset, lr=lr)
    return {"final": train_recurrence(make, seed)}


def _key(arm: tuple[str, str | None], lr: float, seed: int) -> str:
    return f"{arm[0]}/{arm[1]}/lr{lr!r}/seed{seed}"


def tune(arm: tuple[str, str | None], grid: tuple[float, ...], seeds: list[int], cache: RunCache,
         workers: int, extend: bool = True) -> dict:
    """The arm's mean final loss per rate over `seeds`, the grid doubled or halved while its best is at an edge."""
    lrs, finals = list(grid), {}
    while True:
        todo = [lr for lr in lrs if lr not in finals]
        jobs = [{"key": _key(arm, lr, s), "arm": arm, "lr": lr, "seed": s} for lr in todo for s in seeds]
        records = run_pool(_run, jobs, cache, workers, desc=f"{arm[0]} {arm[1] or ''}")
        by_key = {job["key"]: record["final"] for job, record in zip(jobs, records)}
        finals.update({lr: [by_key[_key(arm, lr, s)] for s in seeds] for lr in todo})
        best = min(finals, key=lambda lr: mean_std(finals[lr])[0])
        if not extend or len(finals) >= 8 or min(finals) < best < max(finals):
            break
        lrs.append(best / 2 if best == min(finals) else best * 2)
    mean, std = mean_std(finals[best])
    return {"grid": {repr(lr): mean_std(v)[0] for lr, v in sorted(finals.items())}, "lr": best, "mean": mean,
            "std": std, "finals": finals}


def markdown(arms: dict, pairs: dict, seeds: int, preset_lr: dict[str, float]) -> str:
    lines = [f"# A fused matrix as one matrix or as its pieces ({NAME})", "",
             f"Command: `python -m benchmarks.{NAME}`", "",
             "symo.train.models_recurrence's small transformer (2 blocks of nn.MultiheadAttention, d_model 32), "
             f"300 steps, {seeds} seeds (each its own initialization and batches, shared by the arms). Validation "
             "loss (floor 0.565). Best rate = lowest mean over the seeds, inside its grid.", "",
             "| arm | best lr | final val (mean ± std) | mean per lr |", "|---|---|---|---|"]
    for name, r in arms.items():
        grid = ", ".join(f"{lr}: {v:.4f}" for lr, v in r["grid"].items())
        lines.append(f"| {name} | {r['lr']} | {r['mean']:.4f} ± {r['std']:.4f} | {grid} |")
    lines += ["", "Pieces against whole matrices, paired over seeds (negative: the pieces end lower):", "",
              "| preset | at each one's best rate | at the preset's rate |", "|---|---|---|"]
    for preset, p in pairs.items():
        lines.append(f"| {preset} | {p['tuned'][0]:+.4f} [{p['tuned'][1]:+.4f}, {p['tuned'][2]:+.4f}] | "
                     f"{preset_lr[preset]}: {p['at_preset_lr'][0]:+.4f} [{p['at_preset_lr'][1]:+.4f}, "
                     f"{p['at_preset_lr'][2]:+.4f}] |")
    return "\n".join(lines) + "\n"


def _diff(a: list[float], b: list[float]) -> list[float]:
    lo, hi = paired_diff_ci95(a, b)
    return [mean_std([x - y for x, y in zip(a, b)])[0], lo, hi]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    seeds = list(range(args.seeds))
    cache = RunCache(args.out / f"{NAME}_runs.json")
    arms, tuned = {}, {}
    arms["AdamW"] = tune(("adamw", None), ADAMW_GRID, seeds, cache, args.workers, extend=False)
    for preset in PRESETS:
        for relax in RELAXATIONS:
            tuned[preset, relax] = tune((preset, relax), SYMO_GRID, seeds, cache, args.workers)
            arms[f"`{preset}`, {LABELS[relax]}"] = tuned[preset, relax]
    preset_lr = {p: symo.PRESETS[p].lr for p in PRESETS}
    pairs = {}
    for preset in PRESETS:
        whole, pieces = tuned[preset, "muon"], tuned[preset, "muon_pieces"]
        at = preset_lr[preset]
        pairs[preset] = {"tuned": _diff(pieces["finals"][pieces["lr"]], whole["finals"][whole["lr"]]),
                         "at_preset_lr": _diff(pieces["finals"][at], whole["finals"][at])}
    md = markdown(arms, pairs, args.seeds, preset_lr)
    data = {"arms": {k: {**v, "finals": {repr(lr): f for lr, f in v["finals"].items()}} for k, v in arms.items()},
            "pairs": pairs, "seeds": args.seeds}
    write_results(args.out, NAME, md, data)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
