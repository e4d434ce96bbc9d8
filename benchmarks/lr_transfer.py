"""Does one learning rate per Symo preset work across the bundled benchmarks? Each preset's best rate on each
benchmark problem, over its documented rate.

    python -m benchmarks.lr_transfer            # writes benchmarks/results/lr_transfer.{md,json}
    python -m benchmarks.lr_transfer --quick    # a smoke run: 2 presets, 2 problems, no extension, temp dir

Per preset (symo.PRESETS, all of them) and problem (train_mlp tanh and linear, the MNIST autoencoder, the RNN
of rnn_train, paper_mlp tanh and linear, and nanoGPT at the small size of nanogpt_compare): a factor-3 grid of
three rates centred on GRID_CENTRE (the preset's rate when this was measured, so the table does not move when
PRESETS changes), seed 0, the benchmark's own model, data, length, schedule and metric (final test or
validation loss). A best rate at the grid's edge extends it by one point that way, at most twice; a best rate
still at an edge after that is a bound (">=" / "<="). Every run is the benchmark's own training function on a
preset arm (benchmarks/preset_arms.py), kept in the benchmark's own run cache (train_mlp_runs.json,
rnn_train_runs.json), so a run the benchmark already made (its symo_notebook and symo_published arms,
rnn_train's symo_rnn_notebook) is not trained again; paper_mlp has no cache of its own, its runs go to
lr_transfer_runs.json. paper_mlp's preset arms run at a constant rate, as its tuned rows do.

nanoGPT is not trained here except for the shampoo preset: the notebook and muon cells are the seed-0 grids of
benchmarks/results/nanogpt_compare.json (factor-2 grids; the muon preset with the gpt_muon spec is Muon, whose
row it takes), and the published, eigen_adam and then_orthogonalize cells come from the screening pass of
benchmarks/results/nanogpt_matrix.json (the same small size; gpt_muon arms) once an arm's grid has finished there,
"pending" otherwise. The nanoGPT
column uses the Muon-style spec gpt_muon; every other problem uses the network's true group (the benchmark's
own Symo spec).

Reported: best / documented (the preset's current lr in symo.PRESETS) per cell and the goal, within 3x
everywhere; per preset, the rate that makes the worst ratio smallest (the geometric midpoint of its best rates,
rounded to 1, 1.5, 2, 3, 5 or 7 x 10^k); and for every preset whose best rates spread over more than 9x, the
same grids under each other update scale its kind accepts (RMS matching to AdamW's update, "adamw", centred on
3e-3; Muon's shape scale, "muon", centred on 0.02) on the six small problems, with the spread they give.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import RunCache, run_pool, write_results
from benchmarks.preset_arms import arm_name

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "lr_transfer"
# the presets' documented rates when this table was measured: every grid is centred here
GRID_CENTRE = {"published": 0.1, "notebook": 0.03, "muon": 0.02, "shampoo": 0.05, "eigen_adam": 3e-3,
               "then_orthogonalize": 0.02}
SCALE_CENTRE = {"adamw": 3e-3, "muon": 0.02}  # the alternative update scales' grids
FACTOR, EXTENSIONS = 3.0, 2
GOAL, SPREAD_LIMIT = 3.0, 9.0
# grid rates are rounded to 3 significant digits (grid_rate), so one factor-3 step measures 3 +- 0.2%:
# ratios and spreads within this tolerance of the limits count as at them
ROUNDING = 1.005
PROBLEMS = ("train_mlp tanh", "train_mlp linear", "mnist_autoencoder", "rnn_train", "paper_mlp tanh",
            "paper_mlp linear", "nanogpt")
SMALL = PROBLEMS[:-1]
RNN_SHAPE = (600, 20, 32, 64)  # steps, length, hidden, batch: rnn_train's committed command
NANOGPT_SPEC = "gpt_muon"
# nanoGPT cells taken from other results: preset -> (results file, regime or None, arm, what differs)
NANOGPT_SOURCES = {"notebook": ("nanogpt_compare.json", None, "symo_muon_notebook", ""),
                   "muon": ("nanogpt_compare.json", None, "muon", ""),
                   "published": ("nanogpt_matrix.json", "screen", f"symo_published_{NANOGPT_SPEC}",
                                 "H_inv refreshed every 10 steps"),
                   **{k: ("nanogpt_matrix.json", "screen", f"symo_{k}_{NANOGPT_SPEC}", "")
                      for k in ("eigen_adam", "then_orthogonalize")}}


# ------------------------------------------------------------------ the rule (pure functions, tested)
def grid_rate(x: float) -> float:
    """A grid rate, rounded to 3 significant digits, so run keys are stable."""
    return float(f"{x:.3g}")


def first_grid(centre: float) -> list[float]:
    return [grid_rate(centre / FACTOR), grid_rate(centre), grid_rate(centre * FACTOR)]


def best_of(finals: dict[float, float]) -> float:
    """The rate of the lowest final loss (ties: the smaller rate)."""
    return min(finals, key=lambda lr: (finals[lr] if math.isfinite(finals[lr]) else math.inf, lr))


def extension(finals: dict[float, float]) -> float | None:
    """The next rate to try when the best is at the grid's edge (None inside)."""
    lrs = sorted(finals)
    best = best_of(finals)
    if best == lrs[0]:
        return grid_rate(lrs[0] / FACTOR)
    if best == lrs[-1]:
        return grid_rate(lrs[-1] * FACTOR)
    return None


def nice(x: float) -> float:
    """x rounded, in log scale, to 1, 1.5, 2, 3, 5 or 7 x 10^k."""
    k = math.floor(math.log10(x))
    candidates = [m * 10.0 ** e for e in (k - 1, k, k + 1) for m in (1, 1.5, 2, 3, 5, 7)]
    return float(f"{min(candidates, key=lambda c: abs(math.log(c / x))):.3g}")


def recommend(best: list[float]) -> float:
    """The rate that makes the worst ratio best / rate smallest: the geometric midpoint of the extremes."""
    return nice(math.sqrt(min(best) * max(best)))


@dataclass
class Cell:
    """One (preset, scale, problem): its seed-0 grid, grown at an edge at most EXTENSIONS times."""

    preset: str
    scale: str | None
    problem: str
    finals: dict[float, float] = field(default_factory=dict)
    todo: list[float] = field(default_factory=list)
    extensions: int = 0
    seconds: float = 0.0
    source: str = "trained"

    def record(self, lr: float, final: float, seconds: float) -> None:
        self.finals[lr] = final
        self.seconds += seconds

    def advance(self) -> None:
        """After a round: the next rate due, if the best sits at an edge and extensions are left."""
        self.todo = []
        nxt = extension(self.finals) if self.finals else None
        if nxt is not None and self.extensions < EXTENSIONS and nxt not in self.finals:
            self.extensions += 1
            self.todo = [nxt]

    @property
    def best(self) -> float | None:
        return best_of(self.finals) if self.finals else None

    @property
    def bound(self) -> str:
        """'>=' or '<=' when the best is still at an edge of the grid (the optimum may lie beyond), else ''."""
        if not self.finals or extension(self.finals) is None:
            return ""
        return "<=" if self.best == min(self.finals) else ">="


# ------------------------------------------------------------------ the benchmarks' own runs
def _paper_run(job: dict) -> dict:
    from benchmarks import paper_mlp

    t = time.time()
    curve = paper_mlp.run(job["act"], job["arm"], 0, job["steps"], lr=job["lr"])
    return {"final": curve[-1], "curve": curve, "seconds": time.time() - t}


def _nanogpt_run(job: dict) -> dict:
    from benchmarks import nanogpt_compare

    return nanogpt_compare.run_one(job)


@dataclass
class Problem:
    """How to run one problem: its job for (arm, lr), the training function, the cache, the final loss."""

    fn: Callable[[dict], dict]
    cache: RunCache
    job: Callable[[str, float], dict]
    arm: Callable[[str, str | None], str]
    final: Callable[[dict], float] = lambda r: r["final"]
    seconds: Callable[[dict], float] = lambda r: r.get("seconds", 0.0)


def problems(out: Path, quick: bool, run_root: str) -> dict[str, Problem]:
    from benchmarks import nanogpt_compare, paper_mlp, rnn_train, train_mlp

    def aliased(table: dict[str, str]) -> Callable[[str, str | None], str]:
        inverse = {v: k for k, v in table.items()}  # a benchmark arm that is the preset as it is
        return lambda preset, scale: inverse.get(arm_name(preset, scale), arm_name(preset, scale))

    mlp_cache = RunCache(out / "train_mlp_runs.json")
    own = RunCache(out / f"{NAME}_runs.json")
    steps = 5 if quick else 100
    rnn_shape = (20, 10, 8, 16) if quick else RNN_SHAPE
    gpt = dict(nanogpt_compare.QUICK_SETUP if quick else nanogpt_compare.SETUP)
    size = "x".join(str(gpt[k]) for k in ("n_layer", "n_embd", "n_head", "batch_size", "block_size", "steps"))

    def mlp(name: str) -> Problem:
        return Problem(train_mlp._train_job, mlp_cache,
                       lambda arm, lr: {"key": f"{name}/{arm}/lr{lr:g}/seed0", "problem": name, "optimizer": arm,
                                        "lr": lr, "seed": 0},
                       aliased(train_mlp.PRESET_ARMS))

    def paper(act: str) -> Problem:
        return Problem(_paper_run, own,
                       lambda arm, lr: {"key": f"paper_mlp_{act}/{arm}/lr{lr:g}/seed0/steps{steps}", "act": act,
                                        "arm": arm, "lr": lr, "steps": steps},
                       aliased(paper_mlp.PRESET_ARMS))

    return {
        "train_mlp tanh": mlp("mlp_tanh"),
        "train_mlp linear": mlp("mlp_linear"),
        "mnist_autoencoder": mlp("mnist_autoencoder"),
        "rnn_train": Problem(rnn_train._run_job, RunCache(out / "rnn_train_runs.json"),
                             lambda arm, lr: {"key": f"{arm}/lr{lr!r}/seed0/" + "x".join(map(str, rnn_shape)),
                                              "job": (arm, lr, 0, *rnn_shape)},
                             aliased(rnn_train.PRESET_ARMS),
                             seconds=lambda r: r["ms_per_step"] * rnn_shape[0] / 1000),
        "paper_mlp tanh": paper("tanh"),
        "paper_mlp linear": paper("linear"),
        "nanogpt": Problem(_nanogpt_run, own,
                           lambda arm, lr: {"key": f"nanogpt/{arm}/lr{lr:g}/seed0/{size}", "variant": arm,
                                            "run_root": run_root,
                                            "config": {"optimizer": "symo", "spec": NANOGPT_SPEC, "lr": lr,
                                                       "seed": 0, **_arm_config(arm), **gpt}},
                           lambda preset, scale: arm_name(preset, scale),
                           final=lambda r: r["final_val"], seconds=lambda r: r["wall_s"]),
    }


def _arm_config(arm: str) -> dict[str, Any]:
    """symo train's options of a preset arm (TrainConfig has `preset`, not `update_scale`)."""
    from benchmarks.preset_arms import preset_options

    options = preset_options(arm) or {}
    if "update_scale" in options:
        raise ValueError(f"{arm}: nanoGPT runs here take a preset as it is")
    return options


def nanogpt_cell(preset: str, results: Path) -> Cell:
    """A nanoGPT cell read from nanogpt_compare / nanogpt_matrix results; source 'pending' when not there."""
    cell = Cell(preset, None, "nanogpt")
    file, regime, arm, differs = NANOGPT_SOURCES[preset]
    path = results / file
    entry = None
    if path.is_file():
        data = json.loads(path.read_text())
        entry = (data.get(regime, {}).get("arms", {}) if regime else data.get("optimizers", {})).get(arm)
        progress = data.get(f"{regime}_progress", {}).get(arm, {}) if regime else {}
        if entry is None and progress.get("stage", "").startswith("finished"):  # its grid is done, Muon's not yet
            entry = progress
    if entry is None:
        cell.source = f"pending: {file} ({arm})"
        return cell
    cell.finals = {float(lr): float(v) for lr, v in entry["grid"].items()}
    where = f"{file}, {regime}" + (" (small size)" if regime == "screen" else "") if regime else f"{file}, small size"
    cell.source = f"{where}, {arm}, factor-2 grid" + (f", {differs}" if differs else "")
    return cell


# ------------------------------------------------------------------ the campaign
def run_cells(cells: list[Cell], probs: dict[str, Problem], workers: int, quick: bool) -> int:
    """Train every cell's grid round by round (extending at an edge); returns the number of runs used."""
    for c in cells:
        if not c.finals:
            centre = SCALE_CENTRE[c.scale] if c.scale else GRID_CENTRE[c.preset]
            c.todo = first_grid(centre)[:2] if quick else first_grid(centre)
    used = 0
    while any(c.todo for c in cells):
        for name, prob in probs.items():
            mine = [(c, lr) for c in cells if c.problem == name for lr in c.todo]
            if not mine:
                continue
            jobs = [prob.job(prob.arm(c.preset, c.scale), lr) for c, lr in mine]
            for (c, lr), rec in zip(mine, run_pool(prob.fn, jobs, prob.cache, workers, f"{NAME}: {name}")):
                final = prob.final(rec)
                c.record(lr, final if math.isfinite(final) else math.inf, prob.seconds(rec))
                used += 1
        for c in cells:
            if quick:
                c.todo = []
            else:
                c.advance()
    return used


def accepted_scales(preset: str) -> list[str]:
    """The alternative update scales the preset's kind accepts (not the preset's own)."""
    from symo.optim.kinds import KINDS
    from symo.optim.presets import PRESETS

    values = PRESETS[preset].values
    kind = KINDS[values["preconditioner"]][1]
    return [s for s in SCALE_CENTRE if s in kind.update_scales and s != values.get("update_scale", "natural")]


def spread(cells: list[Cell]) -> float | None:
    best = [c.best for c in cells if c.best is not None]
    return max(best) / min(best) if len(best) > 1 else None


def main(argv: list[str] | None = None) -> int:
    from symo.optim.presets import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1, help="processes for the missing runs (one thread each)")
    ap.add_argument("--quick", action="store_true", help="2 presets, 2 problems, 2-rate grids, to a temp dir")
    ap.add_argument("--out", type=Path, default=None, help="folder of the outputs and the run caches")
    args = ap.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="lr_transfer_")) if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    run_root = tempfile.mkdtemp(prefix="lr_transfer_runs_")  # nanoGPT's checkpoints, not kept
    probs = problems(out, args.quick, run_root)
    presets = ["muon", "notebook"] if args.quick else list(PRESETS)
    small = ["paper_mlp tanh", "rnn_train"] if args.quick else list(SMALL)
    cells = {(p, None, q): Cell(p, None, q) for p in presets for q in small}
    for p in presets:
        if args.quick:
            continue
        if p in NANOGPT_SOURCES:
            cells[(p, None, "nanogpt")] = nanogpt_cell(p, RESULTS)
        else:
            cells[(p, None, "nanogpt")] = Cell(p, None, "nanogpt")  # trained here (shampoo)
    used = run_cells([c for c in cells.values() if c.source == "trained"], probs, args.workers, args.quick)
    wide = [p for p in presets
            if (spread([c for (pp, _s, _q), c in cells.items() if pp == p]) or 1.0) > SPREAD_LIMIT * ROUNDING]
    alt = {(p, s, q): Cell(p, s, q) for p in wide for s in accepted_scales(p) for q in small}
    used += run_cells(list(alt.values()), probs, args.workers, args.quick)
    shutil.rmtree(run_root, ignore_errors=True)
    cells.update(alt)
    data = summarise(cells, presets, small, {p: PRESETS[p].lr for p in presets})
    data["meta"] = {"command": "python -m benchmarks.lr_transfer" + (" --quick" if args.quick else ""),
                    "wall_s": time.time() - t0, "runs": used,
                    "run_seconds": sum(c.seconds for c in cells.values()), "grid_centre": GRID_CENTRE,
                    "scale_centre": SCALE_CENTRE, "factor": FACTOR, "extensions": EXTENSIONS}
    write_results(out, NAME, markdown(data), data)
    print((out / f"{NAME}.md").read_text())
    return 0


# ------------------------------------------------------------------ report
def summarise(cells: dict[tuple, Cell], presets: list[str], small: list[str], documented: dict[str, float]) -> dict:
    table: dict[str, Any] = {}
    for p in presets:
        own = {q: c for (pp, s, q), c in cells.items() if pp == p and s is None}
        best = {q: c.best for q, c in own.items() if c.best is not None}
        rec = recommend(list(best.values())) if best else None
        table[p] = {
            "documented": documented[p], "grid_centre": GRID_CENTRE[p],
            "cells": {q: {"best_lr": c.best, "bound": c.bound, "ratio": (c.best / documented[p]) if c.best else None,
                          "grid": {f"{lr:g}": v for lr, v in sorted(c.finals.items())}, "source": c.source,
                          "run_seconds": c.seconds} for q, c in own.items()},
            "spread": (max(best.values()) / min(best.values())) if best else None,
            "spread_small": spread([own[q] for q in small if q in own]),
            "recommended": rec,
            "worst_ratio_at_recommended": max(max(b / rec, rec / b) for b in best.values()) if best else None,
            "worst_ratio_at_documented": max(max(b / documented[p], documented[p] / b) for b in best.values())
            if best else None,
        }
        scales = {}
        for s in sorted({s for (pp, s, _q) in cells if pp == p and s}):
            alt = {q: c for (pp, ss, q), c in cells.items() if pp == p and ss == s}
            best_alt = [c.best for c in alt.values() if c.best is not None]
            scales[s] = {"grid_centre": SCALE_CENTRE[s], "spread_small": spread(list(alt.values())),
                         "recommended": recommend(best_alt) if best_alt else None,
                         "cells": {q: {"best_lr": c.best, "bound": c.bound, "final": c.finals.get(c.best),
                                       "own_scale_final": own[q].finals.get(own[q].best) if q in own else None,
                                       "grid": {f"{lr:g}": v for lr, v in sorted(c.finals.items())}}
                                   for q, c in alt.items()}}
        table[p]["update_scales"] = scales
    within = [within_goal(c) for t in table.values() for c in t["cells"].values() if c["ratio"] is not None]
    return {"presets": table, "goal": f"best / documented within {GOAL:g}x everywhere",
            "goal_met": all(within), "cells_within_goal": sum(within), "cells_measured": len(within)}


def within_goal(cell: dict) -> bool:
    """best / documented within GOAL either way; a best still at a grid edge (a bound) does not count."""
    return not cell["bound"] and abs(math.log(cell["ratio"])) <= math.log(GOAL * ROUNDING)


def _ratio_text(c: dict) -> str:
    if c["ratio"] is None:
        return "pending" if c["source"].startswith("pending") else "-"
    r = c["ratio"]
    text = f"{r:.2g}x" if r >= 0.095 else f"1/{1 / r:.2g}x"
    return f"{c['bound']}{text}"


def markdown(data: dict) -> str:
    meta, table = data["meta"], data["presets"]
    problems_seen = list(dict.fromkeys(q for t in table.values() for q in t["cells"]))
    head = "| preset | documented lr | " + " | ".join(problems_seen) + " | within 3x |"
    rule = "|---|---:|" + "---:|" * len(problems_seen) + "---|"
    lines = ["# Learning-rate transfer: each preset's best rate over its documented one", "",
             f"Command: `{meta['command']}` ({meta['runs']} runs, {meta['run_seconds'] / 60:.0f} min of training "
             "recorded in them, one process with one thread on 2 shared CPU cores; this invocation took "
             f"{meta['wall_s'] / 60:.0f} min, the runs its caches held were not trained again).", "",
             "Per preset and problem: a factor-3 grid of 3 rates centred on the rate the preset was documented "
             "with when this was measured (column `grid centre` below), seed 0, the benchmark's own model, data, "
             "length, schedule and metric (final test loss; the RNN's final eval MSE; nanoGPT's final validation "
             "loss); a best rate at an edge extends the grid by one point, at most twice, and `>=`/`<=` marks a "
             "best still at an edge after that (such a cell does not count as within the goal). Symo uses each "
             "benchmark's own spec (the network's true group); nanoGPT uses gpt_muon. paper_mlp's preset runs use "
             "a constant rate (as its tuned rows do; its `symo` row uses the paper's decaying schedule). nanoGPT "
             "cells: see the sources below; only the shampoo cell is trained here.", "",
             f"## Best rate / documented rate (goal: within {GOAL:g}x everywhere: "
             f"{'met' if data['goal_met'] else 'not met'}, {data['cells_within_goal']} of "
             f"{data['cells_measured']} cells)", "", head, rule]
    for p, t in table.items():
        ok = all(within_goal(c) for c in t["cells"].values() if c["ratio"])
        lines.append(f"| {p} | {t['documented']:g} | " + " | ".join(
            _ratio_text(t["cells"][q]) if q in t["cells"] else "-" for q in problems_seen) + f" | "
            f"{'yes' if ok else 'no'} |")
    lines += ["", "## Best rates and the recommendation", "",
              "The rate that makes the worst ratio smallest is the geometric midpoint of a preset's best rates "
              "(rounded to 1, 1.5, 2, 3, 5 or 7 x 10^k); `worst ratio` is the largest of best/rate and "
              "rate/best over the measured cells.", "",
              "| preset | grid centre | " + " | ".join(problems_seen) + " | spread | recommended | worst ratio "
              "at recommended | at grid centre |", "|---|---:|" + "---:|" * len(problems_seen) + "---:|---:|---:|---:|"]
    for p, t in table.items():
        cells = [f"{t['cells'][q]['bound']}{t['cells'][q]['best_lr']:g}" if q in t["cells"] and
                 t["cells"][q]["best_lr"] else ("pending" if q in t["cells"] else "-") for q in problems_seen]
        worst_c = max((max(c["best_lr"] / t["grid_centre"], t["grid_centre"] / c["best_lr"])
                       for c in t["cells"].values() if c["best_lr"]), default=None)
        lines.append(f"| {p} | {t['grid_centre']:g} | " + " | ".join(cells) + " | "
                     + (f"{t['spread']:.3g}x | {t['recommended']:g} | {t['worst_ratio_at_recommended']:.2g}x | "
                        f"{worst_c:.2g}x |" if t["spread"] else "- | - | - | - |"))
    alt_rows = [(p, s, a) for p, t in table.items() for s, a in t["update_scales"].items()]
    if alt_rows:
        small = [q for q in problems_seen if q != "nanogpt"]
        lines += ["", f"## Other update scales for the presets whose best rates spread over {SPREAD_LIMIT:g}x", "",
                  "The same grids on the small problems (not nanoGPT) under the update scales the preset's kind "
                  "accepts: `adamw` rescales each block's update to RMS 0.2 (AdamW's rates, grid centred on "
                  "3e-3), `muon` is Muon's shape scale (grid centred on 0.02). A preset keeps its own scale; "
                  "these are measured alternatives. Cells: best rate (its final loss / the final loss of the "
                  "preset's own scale at its best rate).", "",
                  "| preset | scale | " + " | ".join(small) + " | spread | spread at own scale | recommended |",
                  "|---|---|" + "---:|" * len(small) + "---:|---:|---:|"]
        for p, s, a in alt_rows:
            cells = []
            for q in small:
                c = a["cells"].get(q)
                if not c or c["best_lr"] is None:
                    cells.append("-")
                    continue
                rel = (f" ({c['final'] / c['own_scale_final']:.2g})" if c["own_scale_final"] and
                       math.isfinite(c["final"]) and c["own_scale_final"] > 0 else "")
                cells.append(f"{c['bound']}{c['best_lr']:g}{rel}")
            lines.append(f"| {p} | {s} | " + " | ".join(cells) + f" | {a['spread_small']:.3g}x | "
                         f"{table[p]['spread_small']:.3g}x | {a['recommended']:g} |")
    lines += ["", "## Grids (seed 0: rate: final loss)", ""]
    for p, t in table.items():
        for q, c in t["cells"].items():
            grid = ", ".join(f"{lr}: {v:.4g}" for lr, v in c["grid"].items()) or c["source"]
            src = "" if c["source"] == "trained" else f" ({c['source']})"
            lines.append(f"- {p}, {q}{src}: {grid}")
        for s, a in t["update_scales"].items():
            for q, c in a["cells"].items():
                lines.append(f"- {p} at update_scale={s}, {q}: "
                             + ", ".join(f"{lr}: {v:.4g}" for lr, v in c["grid"].items()))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
