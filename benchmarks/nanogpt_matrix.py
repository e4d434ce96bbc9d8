"""nanoGPT on character Shakespeare: Symo's preconditioners against tuned AdamW, Muon, SOAP and PSGD-Kron,
at two data-to-model ratios.

    python -m benchmarks.nanogpt_matrix                 # both regimes -> benchmarks/results/nanogpt_matrix.*
    python -m benchmarks.nanogpt_matrix --regime data_rich --arms adamw,muon   # a part of the campaign
    python -m benchmarks.nanogpt_matrix --quick         # a smoke run (a tiny GPT, 10 steps), to a temp dir
    python -m benchmarks.nanogpt_matrix --report        # train nothing: report what the run cache holds

Regimes (REGIMES): `reference`, the 4-layer d_model-128 GPT at batch 32 x context 128 for 1000 steps (4.1M
tokens for 0.80M non-embedding parameters, 0.26x Chinchilla's 20 tokens per parameter), and `data_rich`,
a 2-layer d_model-64 GPT at the same batch and steps (4.1M tokens for 0.10M non-embedding parameters, 2.05x
Chinchilla). The data-rich model is the largest that reaches 2x Chinchilla in the reference's token budget,
which is about one pass over the training split, so no token is seen twice on average.

Protocol per arm and regime (every arm tuned the same way, at the full run length):
1. learning rate: a 3-point grid (seed 0, weight decay 0); a best rate at the grid's edge extends the grid by
   one point that way (at most twice), so every chosen rate is inside its grid;
2. decoupled weight decay from {0, 0.05, 0.1} at the chosen rate (seed 0), on the hidden matrices (AdamW:
   on every parameter, as torch.optim.AdamW does);
3. seeds 1 and 2 at the chosen (rate, decay). Seeds share the initialization and the batches across arms.
Muon, SOAP, PSGD-Kron and Symo update the hidden matrices; embeddings, LayerNorm gains and biases go to
AdamW at 3e-3 (not tuned) in each of them. SOAP and PSGD-Kron are heavyball's, at its documented defaults
apart from the tuned rate and decay, with torch.compile off (heavyball compiles by default; on this CPU the
compile costs minutes per run and changes no number beyond rounding).

Reported: mean +- std of the final validation loss, the paired 95% interval of the difference to Muon, steps
to the target (the worst AdamW seed's final loss), the steps the seed-mean curve takes to Muon's mean final
loss as a ratio of Muon's own, and ms per step against AdamW (timed in one process, interleaved, on an idle
machine). Every finished run
goes to a run cache (nanogpt_matrix_<regime>_runs.json beside the outputs): an interrupted campaign continues
where it stopped, and a finished one rebuilds its report without training. `--report` trains nothing and
reports what the cache holds: finished arms in the regime tables, the others in a progress table.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    RunCache,
    RunPool,
    interleaved_ms_per_step,
    mean_std,
    paired_diff_ci95,
    write_results,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NAME = "nanogpt_matrix"
COMMON = {"batch_size": 32, "block_size": 128, "steps": 1000, "eval_interval": 20, "eval_batches": 4,
          "warmup": 20, "adamw_lr": 3e-3}
REGIMES: dict[str, dict[str, Any]] = {
    "reference": dict(COMMON, n_layer=4, n_head=4, n_embd=128),
    "data_rich": dict(COMMON, n_layer=2, n_head=4, n_embd=64),
    # the screening pass: the reference model at a quarter of its tokens per step and half its steps
    "screen": dict(COMMON, n_layer=4, n_head=4, n_embd=128, batch_size=16, block_size=64, steps=500),
}
TUNED_REGIMES = ("reference", "data_rich")
QUICK = {"batch_size": 4, "block_size": 16, "steps": 10, "eval_interval": 5, "eval_batches": 1, "warmup": 2,
         "adamw_lr": 3e-3, "n_layer": 1, "n_head": 2, "n_embd": 32}
WEIGHT_DECAYS = (0.0, 0.05, 0.1)
SEEDS = 3

# arm -> how it is built and its starting learning-rate grid (hidden matrices; AdamW: every parameter)
ARMS: dict[str, dict[str, Any]] = {
    "adamw": {"kind": "adamw", "grid": [2e-3, 4e-3, 8e-3], "label": "AdamW"},
    "muon": {"kind": "muon", "grid": [0.01, 0.02, 0.04], "label": "Muon"},
    "soap": {"kind": "heavyball", "class": "SOAP", "grid": [1.5e-3, 3e-3, 6e-3], "label": "SOAP (heavyball)"},
    "kron": {"kind": "heavyball", "class": "PSGDKron", "grid": [5e-4, 1e-3, 2e-3],
             "label": "PSGD-Kron (heavyball)"},
    "symo_defaults_gpt_muon": {"kind": "symo", "spec": "gpt_muon", "options": {"update_scale": "muon"},
                               "grid": [0.01, 0.02, 0.04], "label": "Symo defaults, gpt_muon"},
    "symo_defaults_gpt_true": {"kind": "symo", "spec": "gpt_true", "options": {"update_scale": "muon"},
                               "grid": [0.01, 0.02, 0.04], "label": "Symo defaults, gpt_true"},
    **{f"symo_{kind}_{spec}": {"kind": "symo", "spec": spec, "options": options, "grid": grid,
                              "label": f"Symo {kind}, {spec}"}
       for kind, options, grid in (
           # the published step with H_inv refreshed every 10 steps (every step costs 5-20x Muon's step here)
           ("published", {"preset": "published", "precondition_frequency": 10}, [0.015, 0.03, 0.06]),
           ("eigen_adam", {"preset": "eigen_adam"}, [1.5e-3, 3e-3, 6e-3]),
           ("then_orthogonalize", {"preset": "then_orthogonalize"}, [0.01, 0.02, 0.04]))
       for spec in ("gpt_true", "gpt_muon")},
}


# ------------------------------------------------------------------ one run (in a worker process)
def build(arm: dict, model: Any, lr: float, wd: float, adamw_lr: float, n_embd: int, n_head: int) -> Any:
    """The arm's optimizer for `model` (a symo.train GPT)."""
    import torch

    from symo.train.muon import Muon, is_hidden_matrix

    named = list(model.named_parameters())
    if arm["kind"] == "adamw":
        return torch.optim.AdamW([p for _, p in named], lr=lr, betas=(0.9, 0.95), weight_decay=wd)
    if arm["kind"] == "muon":
        return Muon(named, lr=lr, weight_decay=wd, adamw_lr=adamw_lr)
    if arm["kind"] == "heavyball":
        import heavyball  # the baseline library, a benchmark dependency (the bench extra)
        import heavyball.utils

        heavyball.utils.compile_mode = None
        hidden = [p for n, p in named if is_hidden_matrix(n, p)]
        rest = [p for n, p in named if not is_hidden_matrix(n, p)]
        return Chained(getattr(heavyball, arm["class"])(hidden, lr=lr, weight_decay=wd),
                       torch.optim.AdamW(rest, lr=adamw_lr, betas=(0.9, 0.95), weight_decay=0.0))
    import symo

    spec = symo.load_spec(arm["spec"])
    sizes = {s.name: n_embd // n_head for s in spec.spaces if s.per and s.size is None} or None
    return symo.Symo(named, spec, lr=lr, sizes=sizes, weight_decay=wd, adamw_lr=adamw_lr, **arm.get("options", {}))


class Chained:
    """Two torch optimizers stepped as one (a baseline on the hidden matrices, AdamW on the rest): one list
    of param groups, so the training loop's schedule scales both."""

    def __init__(self, *optimizers: Any) -> None:
        self.optimizers = optimizers
        self.param_groups = [g for o in optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        for o, s in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(s)


def run_one(job: dict) -> dict:
    """One training run (1 thread)."""
    import torch

    torch.set_num_threads(1)
    from symo.train import TrainConfig, train

    setup, arm = job["setup"], ARMS[job["arm"]]
    out_dir = Path(tempfile.mkdtemp(prefix="nanogpt_matrix_run_"))
    cfg = TrainConfig(optimizer="adamw", lr=job["lr"], seed=job["seed"], progress=False, sample_chars=0,
                      out_dir=str(out_dir), **{k: setup[k] for k in ("steps", "batch_size", "block_size", "n_layer",
                                                                      "n_head", "n_embd", "eval_interval",
                                                                      "eval_batches", "warmup")})
    t = time.perf_counter()
    res = train(cfg, optimizer_factory=lambda model: build(arm, model, job["lr"], job["wd"], setup["adamw_lr"],
                                                           setup["n_embd"], setup["n_head"]))
    h = res["history"]
    evals = [(int(s), v) for s, v in zip(h["step"], h["val_loss"]) if not math.isnan(v)]
    import shutil

    shutil.rmtree(out_dir, ignore_errors=True)
    return {"arm": job["arm"], "regime": job["regime"], "lr": job["lr"], "wd": job["wd"], "seed": job["seed"],
            "final_val": res["final_val"], "evals": evals, "ms_per_step_in_run": res["ms_per_step"],
            "wall_s": time.perf_counter() - t}


def job_for(regime: str, setup: dict, arm: str, lr: float, wd: float, seed: int) -> dict:
    size = "x".join(str(setup[k]) for k in ("n_layer", "n_embd", "n_head", "batch_size", "block_size", "steps"))
    return {"key": f"{regime}/{size}/{arm}/lr{lr:g}/wd{wd:g}/seed{seed}", "regime": regime, "setup": setup,
            "arm": arm, "lr": lr, "wd": wd, "seed": seed}


# ------------------------------------------------------------------ the campaign's schedule
class Tuning:
    """One arm in one regime: its rate grid (seed 0, decay 0), then decays at the chosen rate, then seeds.
    In the screening regime the rate grid alone, and for Muon its seeds at the chosen rate (the spread)."""

    def __init__(self, regime: str, setup: dict, arm: str, quick: bool) -> None:
        self.regime, self.setup, self.arm, self.quick = regime, setup, arm, quick
        self.screen = regime == "screen"
        self.n_seeds = 2 if quick else SEEDS
        self.grid = list(ARMS[arm]["grid"][1:] if quick else ARMS[arm]["grid"])
        self.extensions = 0
        self.rates: dict[float, float] = {}   # lr -> final val (seed 0, decay 0)
        self.decays: dict[float, float] = {}  # wd -> final val (seed 0, chosen lr)
        self.lr: float | None = None
        self.wd: float | None = None
        self.runs: dict[int, dict] = {}       # seed -> run at (lr, wd)
        self.seed0: dict[tuple[float, float], dict] = {}  # (lr, wd) -> the seed-0 run

    def first_jobs(self) -> list[dict]:
        return [job_for(self.regime, self.setup, self.arm, lr, 0.0, 0) for lr in self.grid]

    def done(self, job: dict, run: dict) -> list[dict]:
        """Record a finished run; the jobs it makes due."""
        if job["seed"] == 0:
            self.seed0[(job["lr"], job["wd"])] = run
        if self.lr is None and job["wd"] == 0.0 and job["seed"] == 0:
            self.rates[job["lr"]] = run["final_val"]
            if len(self.rates) < len(self.grid):
                return []
            best = min(self.rates, key=lambda lr: (self.rates[lr], lr))
            edge = sorted(self.grid)
            extra = edge[0] / 2 if best == edge[0] else edge[-1] * 2 if best == edge[-1] else None
            if extra is not None and self.extensions < 2 and not self.quick:
                self.extensions += 1
                self.grid.append(extra)
                return [job_for(self.regime, self.setup, self.arm, extra, 0.0, 0)]
            self.lr = best
            self.decays[0.0] = self.rates[best]
            if self.screen:
                self.wd = 0.0
                self.runs[0] = self.seed0[(best, 0.0)]
                seeds = range(1, self.n_seeds) if self.arm == "muon" else range(0)
                return [job_for(self.regime, self.setup, self.arm, best, 0.0, s) for s in seeds]
            return [job_for(self.regime, self.setup, self.arm, best, wd, 0) for wd in WEIGHT_DECAYS if wd]
        if self.lr is not None and self.wd is None and job["lr"] == self.lr and job["seed"] == 0:
            self.decays[job["wd"]] = run["final_val"]
            if len(self.decays) < len(WEIGHT_DECAYS):
                return []
            self.wd = min(self.decays, key=lambda wd: (self.decays[wd], wd))
            self.runs[0] = self.seed0[(self.lr, self.wd)]
            seeds = range(1, self.n_seeds)
            return [job_for(self.regime, self.setup, self.arm, self.lr, self.wd, s) for s in seeds]
        if job["lr"] == self.lr and job["wd"] == self.wd:
            self.runs[job["seed"]] = run
        return []

    def seed_runs(self) -> list[dict]:
        return [self.runs[s] for s in sorted(self.runs)]

    def finished(self) -> bool:
        if self.screen:
            return self.lr is not None and len(self.runs) == (self.n_seeds if self.arm == "muon" else 1)
        return len(self.runs) == self.n_seeds


class RegimeCaches:
    """One run cache per regime (nanogpt_matrix_<regime>_runs.json), so that two regimes can train in two
    processes at once; looked up by the regime that starts each key."""

    def __init__(self, out: Path, regimes: list[str]) -> None:
        self.caches = {r: RunCache(out / f"{NAME}_{r}_runs.json") for r in regimes}

    def _of(self, key: str) -> RunCache:
        regime = key.split("/", 2)[1] if key.startswith("timing/") else key.split("/", 1)[0]
        return self.caches[regime]

    def __contains__(self, key: str) -> bool:
        return key in self._of(key)

    def __getitem__(self, key: str) -> dict:
        return self._of(key)[key]

    def get(self, key: str, default: dict | None = None) -> dict | None:
        return self._of(key).get(key, default)

    def put(self, key: str, record: dict) -> None:
        self._of(key).put(key, record)


def screened_out(tunings: dict[tuple[str, str], Tuning]) -> dict[str, str]:
    """Arms the screening pass drops from the reference regime: their best grid loss is worse than Muon's
    mean by more than two of Muon's seed spreads. {} until the screen has finished for Muon."""
    muon = tunings.get(("screen", "muon"))
    if muon is None or not muon.finished():
        return {}
    m, s = mean_std(r["final_val"] for r in muon.seed_runs())
    out = {}
    for (regime, arm), t in tunings.items():
        if regime == "screen" and t.lr is not None and arm not in ("muon", "adamw"):
            best = t.rates[t.lr]
            if best > m + 2 * s:
                out[arm] = f"{best:.4f} > Muon's {m:.4f} + 2 x {s:.4f}"
    return out


# ------------------------------------------------------------------ timing (after training, one process)
def timing(setup: dict, chosen: dict[str, tuple[float, float]], rounds: int = 5, steps: int = 4) -> dict[str, float]:
    """Median ms per (forward + backward + step) per arm at its chosen (lr, wd): interleaved rounds, 1 thread."""
    import torch

    torch.set_num_threads(1)
    from symo.train.data import load_corpus
    from symo.train.models import GPT, GPTConfig

    corpus = load_corpus(None)
    x, y = corpus.batch("train", 0, setup["batch_size"], setup["block_size"], 0)
    setups = {}
    for arm, (lr, wd) in chosen.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=setup["block_size"], vocab_size=corpus.vocab_size, n_layer=setup["n_layer"],
                              n_head=setup["n_head"], n_embd=setup["n_embd"]))
        setups[arm] = (model, build(ARMS[arm], model, lr, wd, setup["adamw_lr"], setup["n_embd"], setup["n_head"]))
    return interleaved_ms_per_step(setups, x, y, rounds, steps)


def steps_to(evals: list, target: float) -> int | None:
    return next((int(s) for s, v in evals if v <= target), None)


def mean_curve(runs: list[dict]) -> list[tuple[int, float]]:
    """The seeds' mean validation curve, at the evaluation steps they share."""
    curves = [dict(r["evals"]) for r in runs]
    shared = sorted(set.intersection(*(set(c) for c in curves)))
    return [(s, statistics.mean(c[s] for c in curves)) for s in shared]


def non_embedding_params(setup: dict) -> int:
    """Parameters apart from the token and position embeddings (the Chinchilla count)."""
    d, n = setup["n_embd"], setup["n_layer"]
    return n * (12 * d * d + 13 * d) + 2 * d


# ------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regime", choices=[*REGIMES, "all"], default="all",
                   help="all: the screening pass, then data_rich and reference (without the arms it drops)")
    p.add_argument("--arms", default=None, help="comma-separated arms (default: all of them)")
    p.add_argument("--workers", type=int, default=2, help="processes for the missing runs (one thread each)")
    p.add_argument("--quick", action="store_true", help="a tiny GPT, 10 steps, to a temp dir")
    p.add_argument("--out", type=Path, default=None, help="folder of the outputs and the run cache")
    p.add_argument("--no-timing", action="store_true", help="skip the ms/step timing (report without it)")
    p.add_argument("--report", action="store_true",
                   help="train nothing: the report of what the run cache holds (unfinished arms in a progress table)")
    p.add_argument("--skip-screen", action="store_true",
                   help="--regime reference without waiting for the screening pass (for arms it keeps anyway)")
    args = p.parse_args(argv)
    arms = list(ARMS) if args.arms is None else args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        p.error(f"--arms: unknown arm(s) {unknown}; the arms are {list(ARMS)}")
    regimes = ["screen", "data_rich", "reference"] if args.regime == "all" else [args.regime]
    setups = {r: (QUICK if args.quick else REGIMES[r]) for r in regimes}
    out = args.out or (Path(tempfile.mkdtemp(prefix="nanogpt_matrix_")) if args.quick else RESULTS)
    cache = RegimeCaches(out, [*REGIMES])
    tunings = {(r, a): Tuning(r, setups[r], a, args.quick) for r in regimes for a in arms}
    if "reference" in regimes and "screen" not in regimes and not args.skip_screen:  # the screen's verdict
        tunings.update({("screen", a): Tuning("screen", REGIMES["screen"], a, args.quick) for a in arms})
    by_key: dict[str, Tuning] = {}
    started = time.time()
    # two phases: the screen and the data-rich regime, then the reference regime without the arms the
    # screen drops (the slowest arms first in each, so that the pool's tail is short)
    for phase in (("screen", "data_rich"), ("reference",)):
        if args.report:
            replay(tunings, cache, by_key, phase)
            continue
        pool = RunPool(run_one, cache, workers=args.workers, desc=f"nanogpt_matrix {'+'.join(phase)}")
        dropped = screened_out(tunings) if phase == ("reference",) else {}

        def submit(t: Tuning, jobs: list[dict], pool: RunPool = pool) -> None:
            for job in jobs:
                by_key[job["key"]] = t
                pool.submit(job)

        order = sorted(tunings.items(), key=lambda kv: kv[0][1].startswith("symo"), reverse=True)
        for (regime, arm), t in order:
            if regime in phase and arm not in dropped:
                submit(t, t.first_jobs())
        pool.run(lambda job, run: submit(by_key[job["key"]], by_key[job["key"]].done(job, run)))
    print(f"{(time.time() - started) / 60:.1f} minutes", flush=True)
    data, sections = {}, []
    screen = screen_section(tunings)
    if screen is not None:
        data["screen"], text = screen
        sections.append(text)
    elif any(r == "screen" for r, _ in tunings):
        data["screen_progress"], text = progress_section(
            "screen", {a: t for (r, a), t in tunings.items() if r == "screen"})
        sections.append(text)
    for r in [r for r in regimes if r in TUNED_REGIMES]:
        ready = {a: t for (rr, a), t in tunings.items() if rr == r and t.finished()}
        if "adamw" not in ready or "muon" not in ready:  # no target and no Muon to compare with yet
            ready = {}
        unfinished = {a: t for (rr, a), t in tunings.items() if rr == r and a not in ready}
        if unfinished:
            data[f"{r}_progress"], text = progress_section(r, unfinished)
            sections.append(text)
        if not ready:
            continue
        chosen = {a: (t.lr, t.wd) for a, t in ready.items()}
        timing_key = f"timing/{r}/" + ",".join(f"{a}={lr:g}:{wd:g}" for a, (lr, wd) in sorted(chosen.items()))
        if timing_key not in cache and not (args.no_timing or args.report):
            print(f"timing the optimizers ({r}, interleaved rounds) ...", flush=True)
            cache.put(timing_key, {"ms_per_step": timing(setups[r], chosen, rounds=1 if args.quick else 5)})
        ms = (cache.get(timing_key) or {}).get("ms_per_step", {})
        data[r], section = summarize(r, setups[r], ready, ms)
        sections.append(section)
    if not data:
        print("no run in the cache yet: nothing to report")
        return 0
    command = "python -m benchmarks.nanogpt_matrix" + (" --quick" if args.quick else "") + (
        " --report" if args.report else "") + (
        f" --regime {args.regime}" if args.regime != "all" else "") + (f" --arms {args.arms}" if args.arms else "")
    worker_minutes = sum(cache[k]["wall_s"] for k in by_key if k in cache) / 60
    md = "\n".join(["# nanoGPT: Symo's preconditioners against tuned AdamW, Muon, SOAP and PSGD-Kron", "",
                    f"Command: `{command}` ({len(by_key)} runs, {worker_minutes:.0f} worker-minutes of training).",
                    "", *PROTOCOL_NOTES, "", *sections])
    write_results(out, NAME, md, {**data, "command": command, "worker_minutes": worker_minutes})
    plot(out, data, tunings)
    print(md)
    return 0


PROTOCOL_NOTES = (
    "Protocol: per arm and regime, a 3-point learning-rate grid (seed 0, no weight decay, full-length runs, "
    "extended at an edge so every chosen rate is inside its grid), then weight decay from {0, 0.05, 0.1} at the "
    "chosen rate, then seeds 1 and 2 at the chosen pair. Seeds share initialization and batches across arms. "
    "Muon, SOAP, PSGD-Kron and Symo update the hidden matrices; embeddings, LayerNorm gains and biases go to "
    "AdamW at 3e-3 in each. SOAP and PSGD-Kron: heavyball, documented defaults apart from rate and decay, "
    "torch.compile off. Target = the worst AdamW seed's final validation loss. `Muon-loss steps` = steps the "
    "arm's seed-mean validation curve takes to reach Muon's mean final loss, as a ratio of the steps Muon's own "
    "seed-mean curve takes (evaluations every 20 steps; the figure the public speed records use). "
    "`diff to Muon` = paired 95% interval of (arm - Muon) final loss over the 3 seeds (negative: better than "
    "Muon).",
)


def replay(tunings: dict[tuple[str, str], Tuning], cache: RegimeCaches, by_key: dict[str, Tuning],
           phase: tuple[str, ...]) -> None:
    """Advance every tuning of `phase` through the runs the cache holds, training nothing (--report)."""
    pending = [(t, job) for (regime, _), t in tunings.items() if regime in phase for job in t.first_jobs()]
    while pending:
        t, job = pending.pop(0)
        by_key[job["key"]] = t
        if job["key"] in cache:
            pending += [(t, due) for due in t.done(job, cache[job["key"]])]


def progress_section(regime: str, unfinished: dict[str, Tuning]) -> tuple[dict, str]:
    """Arms not in a regime table yet (their protocol, or AdamW's or Muon's, is unfinished): stage and seed-0 runs."""
    def stage(t: Tuning) -> str:
        if t.finished():
            return f"finished at lr {t.lr:g}, wd {t.wd:g} ({len(t.runs)} seed{'s' * (len(t.runs) > 1)})"
        if t.lr is None:
            return f"rate grid, {len(t.rates)} of {len(t.grid)} runs"
        if t.wd is None:
            return f"weight decay at lr {t.lr:g}, {len(t.decays)} of {len(WEIGHT_DECAYS)}"
        return f"seeds at lr {t.lr:g}, wd {t.wd:g}: {len(t.runs)} of {t.n_seeds}"

    data = {a: {"stage": stage(t), "lr": t.lr, "weight_decay": t.wd,
                "grid": {f"{lr:g}": v for lr, v in sorted(t.rates.items())},
                "decays": {f"{wd:g}": v for wd, v in sorted(t.decays.items())},
                "val_finals": [r["final_val"] for r in t.seed_runs()]} for a, t in unfinished.items()}
    lines = [f"## {regime}: in progress (seed-0 runs so far; a result once the arm's protocol, AdamW's and Muon's "
             "have finished)", "",
             "| arm | stage | best seed-0 final val so far | lr: final val | wd: final val |", "|---|---|---|---|---|"]
    for a, t in sorted(unfinished.items(), key=lambda kv: min(kv[1].rates.values(), default=math.inf)):
        best = min([*t.rates.values(), *t.decays.values()], default=None)
        rates = ", ".join(f"{lr:g}: {v:.4f}" for lr, v in sorted(t.rates.items())) or "-"
        decays = ", ".join(f"{wd:g}: {v:.4f}" for wd, v in sorted(t.decays.items())) or "-"
        lines.append(f"| {ARMS[a]['label']} | {stage(t)} | {'-' if best is None else f'{best:.4f}'} | {rates} "
                     f"| {decays} |")
    return data, "\n".join(lines) + "\n"


def screen_section(tunings: dict[tuple[str, str], Tuning]) -> tuple[dict, str] | None:
    """The screening pass's table: each arm's rate grid at the small size, and whether it was dropped."""
    rows = {a: t for (r, a), t in tunings.items() if r == "screen" and t.lr is not None}
    muon = tunings.get(("screen", "muon"))
    if not rows or muon is None or not muon.finished():
        return None
    m, s = mean_std(r["final_val"] for r in muon.seed_runs())
    dropped = screened_out(tunings)
    data = {"setup": REGIMES["screen"], "muon_mean": m, "muon_std": s, "dropped": dropped,
            "arms": {a: {"lr": t.lr, "best": t.rates[t.lr],
                         "grid": {f"{lr:g}": v for lr, v in sorted(t.rates.items())}} for a, t in rows.items()}}
    lines = ["## Screening pass: the reference model at batch 16 x context 64, 500 steps (seed 0)", "",
             f"Muon: {m:.4f} ± {s:.4f} over {muon.n_seeds} seeds at its chosen rate. An arm whose best grid loss is "
             f"worse than Muon's mean by more than two of Muon's seed spreads ({m + 2 * s:.4f}) is dropped from the "
             "reference regime (it still runs in the data-rich regime).", "",
             "| arm | best lr | best final val (seed 0) | grid (lr: final val) | reference regime |",
             "|---|---|---|---|---|"]
    for a, t in sorted(rows.items(), key=lambda kv: kv[1].rates[kv[1].lr]):
        grid = ", ".join(f"{lr:g}: {v:.4f}" for lr, v in sorted(t.rates.items()))
        lines.append(f"| {ARMS[a]['label']} | {t.lr:g} | {t.rates[t.lr]:.4f} | {grid} | "
                     f"{'dropped: ' + dropped[a] if a in dropped else 'kept'} |")
    return data, "\n".join(lines) + "\n"


def summarize(regime: str, setup: dict, ready: dict[str, Tuning], ms: dict[str, float]) -> tuple[dict, str]:
    runs = {a: t.seed_runs() for a, t in ready.items()}
    target = max(r["final_val"] for r in runs["adamw"])
    muon_final = statistics.mean(r["final_val"] for r in runs["muon"])

    def mean_steps(rs: list[dict], level: float) -> float | None:
        s = [steps_to(r["evals"], level) for r in rs]
        return None if any(x is None for x in s) else statistics.mean(s)

    # on the seeds' mean curve: a seed that ends above the mean would never reach it on its own
    muon_steps = steps_to(mean_curve(runs["muon"]), muon_final)
    arms = {}
    for a, t in ready.items():
        finals = [r["final_val"] for r in runs[a]]
        m, s = mean_std(finals)
        to_muon = steps_to(mean_curve(runs[a]), muon_final)
        arms[a] = {"lr": t.lr, "weight_decay": t.wd, "grid": {f"{lr:g}": v for lr, v in sorted(t.rates.items())},
                   "decays": {f"{wd:g}": v for wd, v in sorted(t.decays.items())}, "val_finals": finals,
                   "mean": m, "std": s,
                   "diff_to_muon_ci95": list(paired_diff_ci95(finals, [r["final_val"] for r in runs["muon"]])),
                   "steps_to_target_mean": mean_steps(runs[a], target),
                   "steps_to_muon_final_ratio": (to_muon / muon_steps) if to_muon and muon_steps else None,
                   "ms_per_step_vs_adamw": (ms[a] / ms["adamw"]) if a in ms and "adamw" in ms else None}
    n = non_embedding_params(setup)
    tokens = setup["batch_size"] * setup["block_size"] * setup["steps"]
    data = {"setup": {**setup, "non_embedding_params": n, "tokens": tokens,
                      "chinchilla_ratio": tokens / (20 * n)}, "target": target, "muon_final": muon_final, "arms": arms}
    lines = [f"## {regime}: GPT {setup['n_layer']}x{setup['n_embd']} ({setup['n_head']} heads), batch "
             f"{setup['batch_size']}x{setup['block_size']}, {setup['steps']} steps: {tokens / 1e6:.1f}M tokens for "
             f"{n / 1e6:.2f}M non-embedding parameters ({tokens / (20 * n):.2f}x Chinchilla)", "",
             f"Target {target:.4f} (worst AdamW seed); Muon's mean final loss {muon_final:.4f}.", "",
             "| arm | lr | wd | final val (3 seeds) | diff to Muon, 95% | steps to target | Muon-loss steps vs Muon "
             "| time/step vs AdamW |", "|---|---|---|---|---|---|---|---|"]
    for a, s in sorted(arms.items(), key=lambda kv: kv[1]["mean"]):
        lo, hi = s["diff_to_muon_ci95"]
        ci = "-" if a == "muon" else f"[{lo:+.4f}, {hi:+.4f}]"
        st = "-" if s["steps_to_target_mean"] is None else f"{s['steps_to_target_mean']:.0f}"
        ratio = "not reached" if s["steps_to_muon_final_ratio"] is None else f"{s['steps_to_muon_final_ratio']:.2f}x"
        tm = "-" if s["ms_per_step_vs_adamw"] is None else f"{s['ms_per_step_vs_adamw']:.2f}x"
        lines.append(f"| {ARMS[a]['label']} | {s['lr']:g} | {s['weight_decay']:g} | {s['mean']:.4f} ± {s['std']:.4f} "
                     f"| {ci} | {st} | {ratio} | {tm} |")
    lines += ["", "Grids (seed 0; learning rate at decay 0, then decay at the chosen rate; * = chosen):", "",
              "| arm | lr: final val | wd: final val |", "|---|---|---|"]
    for a, t in ready.items():
        rates = ", ".join(f"{lr:g}{'*' if lr == t.lr else ''}: {v:.4f}" for lr, v in sorted(t.rates.items()))
        decays = ", ".join(f"{wd:g}{'*' if wd == t.wd else ''}: {v:.4f}" for wd, v in sorted(t.decays.items()))
        lines.append(f"| {ARMS[a]['label']} | {rates} | {decays} |")
    return data, "\n".join(lines) + "\n"


def plot(out: Path, data: dict, tunings: dict) -> None:
    """Validation curves per tuned regime: each finished arm's mean over seeds, or, while a regime is still in
    progress, each arm's best seed-0 run so far (dashed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = [r for r in TUNED_REGIMES if r in data or f"{r}_progress" in data]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4.8), squeeze=False)
    for ax, regime in zip(axes[0], panels):
        d = data.get(regime, {"arms": {}})
        curves = []  # (label, steps, losses, final, dashed)
        for a in d["arms"]:
            rs = tunings[(regime, a)].seed_runs()
            steps = [s for s, _ in rs[0]["evals"]]
            mean = [statistics.mean(dict(r["evals"]).get(s, math.nan) for r in rs) for s in steps]
            final = d["arms"][a]["mean"]
            curves.append((f"{ARMS[a]['label']} ({final:.3f})", steps, mean, final, False))
        for a in data.get(f"{regime}_progress", {}):
            seed0 = tunings[(regime, a)].seed0
            if seed0:
                best = min(seed0.values(), key=lambda r: r["final_val"])
                steps, losses = zip(*best["evals"])
                curves.append((f"{ARMS[a]['label']} (seed 0 so far, {best['final_val']:.3f})", steps, losses,
                               best["final_val"], True))
        if not curves:
            continue
        ax.set_prop_cycle(color=plt.cm.tab20.colors[::2] + plt.cm.tab20.colors[1::2])  # 20 distinct colours
        for label, steps, losses, _, dashed in sorted(curves, key=lambda c: c[3]):
            ax.plot(steps, losses, label=label, lw=1.2, ls="--" if dashed else "-")
        floor = min(c[3] for c in curves)
        if "muon_final" in d:
            ax.axhline(d["muon_final"], color="gray", ls=":", lw=0.8, label="Muon's final loss")
        ax.set_ylim(floor - 0.1, floor + 0.7)
        ratio = (d.get("setup") or {}).get("chinchilla_ratio")
        title = f"{regime}: {ratio:.2f}x Chinchilla, mean of 3 seeds" if ratio else f"{regime} (in progress)"
        ax.set_title(title + "; dashed: best seed-0 run of an unfinished arm", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (nats / char)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{NAME}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
