"""SOAP's conventions one at a time, and float32 against float64 statistics, on a small tanh MLP (float32 training).

    python -m benchmarks.soap_conventions            # about 2 minutes on one core
    python -m benchmarks.soap_conventions --quick    # seconds, to a temporary folder

Every arm is `preset="soap"` (SOAP's conventions, both sides from the Muon-style spec of a 16-64-64-8 tanh MLP,
minibatches of 32 from a teacher's 512 points, so every statistic is rank-deficient for its first steps) with one
option changed: one of eigen_adam's older conventions, all of them together, or the statistics' dtype. Each arm's
rate is chosen from {3e-3, 1e-2, 3e-2} by the mean final test loss over the seeds. Writes
benchmarks/results/soap_conventions.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from symo.compiler import parse_spec

from benchmarks.harness import machine, write_results
from benchmarks.mlp_common import make_mlp, mlp_spec_toml, mse, teacher_student
from symo.optim import Symo
from symo.optim.bases import Eigh

OUT = Path(__file__).resolve().parent / "results"
LEGACY = {"first_step": "update", "statistic_timing": "before", "refresh": Eigh(), "null_directions": "drop",
          "eps_placement": "adam"}
ARMS: dict[str, dict] = {
    "soap (float32 statistics)": {},
    "soap, float64 statistics": {"stats_dtype": "float64"},
    "first_step='update'": {"first_step": "update"},
    "statistic_timing='before'": {"statistic_timing": "before"},
    "refresh=Eigh()": {"refresh": Eigh()},
    "null_directions='drop' (with Eigh)": {"refresh": Eigh(), "null_directions": "drop"},
    "eps_placement='adam'": {"eps_placement": "adam"},
    "all older conventions, float32": LEGACY,
    "all older conventions, float64": {**LEGACY, "stats_dtype": "float64"},
    "older conventions but 'keep', float64": {**LEGACY, "null_directions": "keep", "stats_dtype": "float64"},
}
RATES = (3e-3, 1e-2, 3e-2)


def run(options: dict, lr: float, seed: int, steps: int) -> dict[str, float]:
    """Final train and test loss of one run (float32 model, minibatches of 32, one thread)."""
    x, y, xt, yt = teacher_student(16, 8, "tanh", seed, dtype=torch.float32)
    model = make_mlp((16, 64, 64, 8), "tanh", seed, dtype=torch.float32)
    spec = parse_spec(mlp_spec_toml(3, "signed_perm", "muon"))
    opt = Symo(model.named_parameters(), spec, preset="soap", lr=lr, **options)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (32,), generator=gen)
        opt.zero_grad()
        mse(model(x[idx]), y[idx]).backward()
        opt.step()
    with torch.no_grad():
        return {"train": float(mse(model(x), y)), "test": float(mse(model(xt), yt))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 arms, 20 steps, one seed, to a temp dir")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    arms = dict(list(ARMS.items())[:2]) if args.quick else ARMS
    steps, seeds = (20, 1) if args.quick else (args.steps, args.seeds)
    out = args.out or (Path(tempfile.mkdtemp(prefix="soap_conventions_")) if args.quick else OUT)
    started = time.time()
    results: dict[str, dict] = {}
    for name, options in arms.items():
        per_rate = {}
        for lr in RATES:
            runs = [run(options, lr, seed, steps) for seed in range(seeds)]
            per_rate[lr] = {"test": statistics.mean(r["test"] for r in runs),
                            "train": statistics.mean(r["train"] for r in runs)}
        best = min(per_rate, key=lambda lr: per_rate[lr]["test"])
        results[name] = {"options": {k: repr(v) for k, v in options.items()}, "best_lr": best,
                         "test": per_rate[best]["test"], "train": per_rate[best]["train"],
                         "by_rate": {f"{lr:g}": v for lr, v in per_rate.items()}}
        print(f"{name}: lr {best:g}, test {per_rate[best]['test']:.4f}", flush=True)
    base = results[next(iter(arms))]["test"]
    command = "python -m benchmarks.soap_conventions " + " ".join(sys.argv[1:] if argv is None else argv)
    rows = ["| arm | best lr | final test loss | vs soap | final train loss | test loss at " + ", ".join(
        f"{lr:g}" for lr in RATES) + " |", "|---|---:|---:|---:|---:|---|"]
    for name, r in results.items():
        rows.append(f"| {name} | {r['best_lr']:g} | {r['test']:.4f} | {r['test'] / base:.2f}x | {r['train']:.4f} | "
                    + ", ".join(f"{v['test']:.4f}" for v in r["by_rate"].values()) + " |")
    text = "\n".join([
        "# SOAP's conventions one at a time (benchmarks/soap_conventions.py)", "",
        f"Command: `{command.strip()}` ({(time.time() - started) / 60:.1f} minutes)", "",
        f"A 16-64-64-8 tanh MLP on a teacher's 512 points, minibatches of 32, {steps} steps, float32 training, "
        f"{seeds} seed(s); every arm is `preset=\"soap\"` on the Muon-style spec with the options shown, its rate "
        f"the best of {list(RATES)} by the mean final test loss.", "", *rows, ""])
    write_results(out, "soap_conventions", text, {"arms": results, "steps": steps, "seeds": seeds,
                                                  "machine": machine()})
    print(text)
    print(json.dumps({k: round(v["test"], 4) for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
