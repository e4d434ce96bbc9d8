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
compile costs minutes per run and changes no number beyond rounding). The authors' SOAP and NorMuon are
pytorch-optimizer's, likewise; NorMuon's Newton-Schulz runs in float32, as the Muon arm's does (the library
fixes bfloat16, which this CPU emulates 15x slower).

Reported: mean +- std of the final validation loss, the paired 95% interval of the difference to Muon, steps
to the target (the worst AdamW seed's final loss), the steps the seed-mean curve takes to Muon's mean final
loss as a ratio of Muon's own, and ms per step against AdamW (the mean over interleaved 10-step rounds in one
process, on an idle machine, so that preconditioner refreshes count). Every finished run
goes to a run cache (nanogpt_matrix_<regime>_runs.json beside the outputs): an interrupted campaign continues
where it stopped, and a finished one rebuilds its report without training. `--report` trains nothing and
reports what the cache holds: finished arms in the regime tables, the others in a progress table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import RunPool, write_results
from benchmarks.nanogpt_matrix_report import PROTOCOL_NOTES, plot, progress_section, screen_section, summarize
from benchmarks.nanogpt_matrix_runs import ARMS, NAME, QUICK, REGIMES, RESULTS, TUNED_REGIMES, run_one, timing
from benchmarks.nanogpt_matrix_schedule import WEIGHT_DECAYS, RegimeCaches, Tuning, replay, screened_out

__all__ = ["ARMS", "REGIMES", "WEIGHT_DECAYS", "Tuning", "main", "screened_out"]


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
    if args.report:
        for phase in PHASES:
            replay(tunings, cache, by_key, phase)
    else:
        train(tunings, cache, by_key, args.workers)
        print(f"{(time.time() - started) / 60:.1f} minutes", flush=True)
    return report(args, regimes, setups, tunings, cache, by_key, out)


# the screen and the data-rich regime, then the reference regime without the arms the screen drops
PHASES = (("screen", "data_rich"), ("reference",))


def train(tunings: dict[tuple[str, str], Tuning], cache: RegimeCaches, by_key: dict[str, Tuning],
          workers: int) -> None:
    """Every run the tunings ask for that the cache lacks, phase by phase (the slowest arms first in each, so
    that the pool's tail is short)."""
    for phase in PHASES:
        pool = RunPool(run_one, cache, workers=workers, desc=f"nanogpt_matrix {'+'.join(phase)}")
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


def report(args: argparse.Namespace, regimes: list[str], setups: dict[str, dict],
           tunings: dict[tuple[str, str], Tuning], cache: RegimeCaches, by_key: dict[str, Tuning], out: Path) -> int:
    """The tables and the plot of what the tunings hold; times the chosen configurations of a tuned regime
    first where its timing is not cached (unless --no-timing or --report)."""
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
        dropped = screened_out(tunings) if r == "reference" else {}
        ready = {a: t for (rr, a), t in tunings.items() if rr == r and t.finished()}
        if "adamw" not in ready or "muon" not in ready:  # no target and no Muon to compare with yet
            ready = {}
        unfinished = {a: t for (rr, a), t in tunings.items() if rr == r and a not in ready and a not in dropped}
        if unfinished:
            data[f"{r}_progress"], text = progress_section(r, unfinished)
            sections.append(text)
        if not ready:
            continue
        chosen = {a: (t.lr, t.wd) for a, t in ready.items()}
        timing_key = f"timing/{r}/mean-of-10-step-rounds/" + ",".join(
            f"{a}={lr:g}:{wd:g}" for a, (lr, wd) in sorted(chosen.items()))
        if timing_key not in cache and not (args.no_timing or args.report):
            print(f"timing the optimizers ({r}, interleaved rounds) ...", flush=True)
            cache.put(timing_key, {"ms_per_step": timing(setups[r], chosen, rounds=1 if args.quick else 5)})
        ms = (cache.get(timing_key) or {}).get("ms_per_step", {})
        data[r], section = summarize(r, setups[r], ready, ms, dropped)
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


if __name__ == "__main__":
    sys.exit(main())
