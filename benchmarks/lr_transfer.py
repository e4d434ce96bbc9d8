"""Does one learning rate per Symo preset work across the bundled benchmarks, and on both kinds of spec? Each
preset's best rate on each benchmark problem, over its documented rate, with the network's true symmetry group and
with a Muon-style spec.

    python -m benchmarks.lr_transfer            # writes benchmarks/results/lr_transfer.{md,json}
    python -m benchmarks.lr_transfer --quick    # a smoke run: 2 presets (1 Muon-style), 2 problems, temp dir

Problems: train_mlp tanh and linear, the MNIST autoencoder, the RNN of rnn_train, paper_mlp tanh and linear (the
small problems), and nanoGPT at the small size of nanogpt_compare. Per preset, spec and problem: a factor-3 grid
of three rates centred on GRID_CENTRE (the preset's rate when this was measured, so the table does not move when
PRESETS changes), seed 0, the benchmark's own model, data, length, schedule and metric (final test or validation
loss). A best rate at the grid's edge extends it by one point that way, at most twice; a best rate still at an
edge after that is a bound (">=" / "<=").

Two spec columns per problem (SPECS):
- "true": the benchmark's own Symo spec, the network's true group (hidden units permuted), for every preset of
  GRID_CENTRE on the small problems (soap_heavyball is not measured: it documents soap's rate; soap on the MNIST
  autoencoder is the costliest cell, its true spec puts fc2 and fc3, both axes permuted, each into one block whose
  two-sided factor is 4096 x 4096, about 8 min a run); on nanoGPT, gpt_true for every preset. NOT_MEASURED holds
  the cells left out with the reason (none today).
- "muon": a Muon-style spec, a private signed_perm row space per weight matrix and the rest to Symo's AdamW (whose
  rate follows lr: 3e-3 at the preset's documented rate): specs/muon.toml for the MLPs, specs/rnn_muon.toml for
  the RNN (the arms "preset_<name>~muon" of benchmarks/preset_arms.py), for MUON_STYLE_PRESETS; nanoGPT's column
  (gpt_muon) for every preset. symo.infer.training_spec is not used: it leaves the first layer and the classifier
  to AdamW, which is every weight of train_mlp's and paper_mlp's two-layer networks, and cannot guess the RNN's
  inputs; every weight matrix in a row space is what each benchmark's own Muon baseline does.

Every run is the benchmark's own training function on a preset arm, kept in the benchmark's own run cache
(train_mlp_runs.json, rnn_train_runs.json), so a run the benchmark already made (its symo_notebook and
symo_published arms, rnn_train's symo_rnn_notebook) is not trained again; paper_mlp has no cache of its own, its
runs go to lr_transfer_runs.json. paper_mlp's preset arms run at a constant rate, as its tuned rows do. A run
whose code changed after the committed caches were made gets a key suffix (key_suffix), so a stale run is never
reused: true-spec runs under Muon's update scale ("/parameter_rms": such a parameter's update is now rescaled to
Muon's per-shape RMS) and eigen_adam's ("/soap_conventions": its kind's defaults are now SOAP's). The AdamW
side's new rate changes no true-spec run: each small problem's true spec covers every parameter
(uncovered_parameters). The Muon-style runs of eigen_adam and soap, whose documented rate moved from 3e-3 to
9e-3 after they were first made (so their AdamW side, lr x 3e-3 / documented, moved too): "/documented9e-3".

nanoGPT (NANOGPT_SOURCES, NANOGPT_TRAINED): on gpt_muon, the notebook and muon cells are the seed-0 grids of
benchmarks/results/nanogpt_compare.json (factor-2 grids; the muon preset with the gpt_muon spec is Muon, whose
row it takes), the published, eigen_adam, soap and then_orthogonalize cells come from the screening pass of
benchmarks/results/nanogpt_matrix.json (the same small size; eigen_adam's is the arm one_sided_soap, the preset
as it is now) once an arm's grid has finished there, "pending" otherwise, and shampoo is trained here. On
gpt_true, the published, eigen_adam and soap cells are that screening pass's gpt_true arms; muon,
then_orthogonalize, notebook and shampoo are trained here (the campaign's gpt_true arms under Muon's scale ran
with parameter_rms=False, no longer the default). Trained here means benchmarks.nanogpt_compare.run_one, i.e.
symo train with the spec and the preset; a gpt_true run's key ends in "/gpt_true" (nanogpt_job). All these runs
give the AdamW side a fixed 3e-3.

Reported per spec: best / documented (the preset's current lr in symo.PRESETS) per cell and the goal, within 3x
everywhere; per preset, the rate that makes the worst ratio smallest (the geometric midpoint of its best rates,
rounded to 1, 1.5, 2, 3, 5 or 7 x 10^k); and for every preset whose best rates on the true spec spread over 9x,
the same true-spec grids under each other update scale its kind accepts (RMS matching to AdamW's update,
"adamw", centred on 3e-3; Muon's shape scale, "muon", centred on 0.02) on the small problems, with the spread
they give.
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
from benchmarks.preset_arms import SPECS, arm_name

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "lr_transfer"
# the presets' documented rates when this table was measured: every grid is centred here
GRID_CENTRE = {"published": 0.1, "notebook": 0.03, "muon": 0.02, "shampoo": 0.05, "eigen_adam": 3e-3,
               "soap": 3e-3, "then_orthogonalize": 0.02}
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
NANOGPT_SPECS = {"true": "gpt_true", "muon": "gpt_muon"}  # nanoGPT's spec in each spec column


def _matrix_sources(spec: str, presets: tuple[str, ...]) -> dict[str, tuple[str, str | None, str, str]]:
    """nanogpt_matrix's screening-pass arms (the small size) that are a preset as it is now, on `spec`."""
    arms = {"published": ("published", "H_inv refreshed every 10 steps"),
            # nanogpt_matrix's arm "eigen_adam" keeps the kind's older conventions; "one_sided_soap" is the
            # eigen_adam preset as it is now
            "eigen_adam": ("one_sided_soap", ""), "soap": ("soap", ""),
            "then_orthogonalize": ("then_orthogonalize", "")}
    return {p: ("nanogpt_matrix.json", "screen", f"symo_{arms[p][0]}_{spec}", arms[p][1]) for p in presets}


# nanoGPT cells taken from other results, per spec column: preset -> (results file, regime or None, arm, what
# differs). Not the campaign's gpt_true arms under Muon's update scale (defaults, then_orthogonalize, soap_muon):
# they ran with parameter_rms=False, no longer the default, so the muon and then_orthogonalize cells of the true
# column are trained here.
NANOGPT_SOURCES = {
    "muon": {"notebook": ("nanogpt_compare.json", None, "symo_muon_notebook", ""),
             "muon": ("nanogpt_compare.json", None, "muon", ""),
             **_matrix_sources("gpt_muon", ("published", "eigen_adam", "soap", "then_orthogonalize"))},
    "true": _matrix_sources("gpt_true", ("published", "eigen_adam", "soap")),
}
# nanoGPT cells trained here (benchmarks.nanogpt_compare.run_one: symo train with the spec and the preset), per
# spec column
NANOGPT_TRAINED = {"muon": ("shampoo",), "true": ("muon", "then_orthogonalize", "notebook", "shampoo")}
# the spec columns: "true", the benchmark's own spec (the network's true group); "muon", a Muon-style spec
SPEC_LABEL = {"true": "true-symmetry spec", "muon": "Muon-style spec"}
MUON_STYLE_PRESETS = ("muon", "then_orthogonalize", "eigen_adam", "soap")  # on the small problems' Muon-style specs
# (preset, spec, problem) -> why its cell is not measured
NOT_MEASURED: dict[tuple[str, str, str], str] = {}
# code changes since the committed caches were made, for runs whose keys did not say so: preset -> key tag
CHANGED_PRESETS = {"eigen_adam": "soap_conventions"}  # eigen_adam's kind now defaults to SOAP's conventions
# Muon-style runs (whose biases go to Symo's AdamW, at lr x 3e-3 / the documented rate) made before a preset's
# documented rate moved: eigen_adam's and soap's went from 3e-3 to 9e-3, so their AdamW side is now a third of lr
CHANGED_MUON_STYLE = {"eigen_adam": "documented9e-3", "soap": "documented9e-3"}


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


def own_scale(preset: str) -> str:
    """The update scale a preset uses as it is."""
    from symo.optim.presets import PRESETS

    return PRESETS[preset].values.get("update_scale", "natural")


def key_suffix(preset: str, scale: str | None, spec: str) -> str:
    """The tag appended to a run's cache key where the code the run uses changed after the committed caches were
    made, so that a stale run is never reused; '' for runs the caches hold as they are now. True-spec runs under
    Muon's update scale: "/parameter_rms" (a parameter whose blocks are not its own rows x cols now moves at
    Muon's per-shape RMS); eigen_adam's true-spec runs: "/soap_conventions"; eigen_adam's and soap's Muon-style
    runs: "/documented9e-3" (their AdamW side follows lr from the new documented rate). The AdamW side's rate,
    which now follows lr, leaves every true-spec run as it was: the small problems' true specs cover every
    parameter (uncovered_parameters)."""
    if spec not in SPECS:
        raise ValueError(f"unknown spec variant {spec!r}; use one of {SPECS}")
    if spec != "true":
        return "/" + CHANGED_MUON_STYLE[preset] if preset in CHANGED_MUON_STYLE else ""
    tags = [CHANGED_PRESETS[preset]] if preset in CHANGED_PRESETS else []
    if (scale or own_scale(preset)) == "muon":
        tags.append("parameter_rms")
    return "".join("/" + t for t in tags)


def spec_presets(spec: str, presets: list[str]) -> list[str]:
    """The presets of `presets` measured on the small problems under `spec`, in `presets`' order."""
    return [p for p in presets if spec == "true" or p in MUON_STYLE_PRESETS]


def not_measured(preset: str, spec: str, problem: str) -> str | None:
    """Why the cell (preset, spec, problem) is not measured; None when it is."""
    if spec == "muon" and problem != "nanogpt" and preset not in MUON_STYLE_PRESETS:
        return "not measured: this preset is measured on the small problems' true spec only"
    return NOT_MEASURED.get((preset, spec, problem))


@dataclass
class Cell:
    """One (preset, scale, problem) on one spec variant: its seed-0 grid, grown at an edge at most EXTENSIONS
    times."""

    preset: str
    scale: str | None
    problem: str
    finals: dict[float, float] = field(default_factory=dict)
    todo: list[float] = field(default_factory=list)
    extensions: int = 0
    seconds: float = 0.0
    source: str = "trained"
    spec: str = "true"

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
    """How to run one problem: its job for (arm, lr, spec column), the training function, the cache, the final
    loss; `suffixed`: its keys take key_suffix (the small problems, whose committed runs predate code changes)."""

    fn: Callable[[dict], dict]
    cache: RunCache
    job: Callable[[str, float, str], dict]
    arm: Callable[[str, str | None, str], str]  # (preset, scale, spec) -> the benchmark's arm
    final: Callable[[dict], float] = lambda r: r["final"]
    seconds: Callable[[dict], float] = lambda r: r.get("seconds", 0.0)
    suffixed: bool = True


def problems(out: Path, quick: bool, run_root: str) -> dict[str, Problem]:
    from benchmarks import nanogpt_compare, paper_mlp, rnn_train, train_mlp

    def aliased(table: dict[str, str]) -> Callable[[str, str | None, str], str]:
        inverse = {v: k for k, v in table.items()}  # a benchmark arm that is the preset as it is
        return lambda preset, scale, spec: inverse.get(arm_name(preset, scale, spec), arm_name(preset, scale, spec))

    mlp_cache = RunCache(out / "train_mlp_runs.json")
    own = RunCache(out / f"{NAME}_runs.json")
    steps = 5 if quick else 100
    rnn_shape = (20, 10, 8, 16) if quick else RNN_SHAPE
    gpt = dict(nanogpt_compare.QUICK_SETUP if quick else nanogpt_compare.SETUP)

    def mlp(name: str) -> Problem:
        return Problem(train_mlp._train_job, mlp_cache,
                       lambda arm, lr, _spec: {"key": f"{name}/{arm}/lr{lr:g}/seed0", "problem": name,
                                               "optimizer": arm,
                                        "lr": lr, "seed": 0},
                       aliased(train_mlp.PRESET_ARMS))

    def paper(act: str) -> Problem:
        return Problem(_paper_run, own,
                       lambda arm, lr, _spec: {"key": f"paper_mlp_{act}/{arm}/lr{lr:g}/seed0/steps{steps}",
                                               "act": act, "arm": arm, "lr": lr, "steps": steps},
                       aliased(paper_mlp.PRESET_ARMS))

    return {
        "train_mlp tanh": mlp("mlp_tanh"),
        "train_mlp linear": mlp("mlp_linear"),
        "mnist_autoencoder": mlp("mnist_autoencoder"),
        "rnn_train": Problem(rnn_train._run_job, RunCache(out / "rnn_train_runs.json"),
                             lambda arm, lr, _spec: {"key": f"{arm}/lr{lr!r}/seed0/"
                                                            + "x".join(map(str, rnn_shape)),
                                                     "job": (arm, lr, 0, *rnn_shape)},
                             aliased(rnn_train.PRESET_ARMS),
                             seconds=lambda r: r["ms_per_step"] * rnn_shape[0] / 1000),
        "paper_mlp tanh": paper("tanh"),
        "paper_mlp linear": paper("linear"),
        "nanogpt": Problem(_nanogpt_run, own, lambda arm, lr, spec: nanogpt_job(arm, lr, spec, gpt, run_root),
                           lambda preset, scale, spec: arm_name(preset, scale),  # its spec: nanogpt_job's
                           final=lambda r: r["final_val"], seconds=lambda r: r["wall_s"], suffixed=False),
    }


def nanogpt_job(arm: str, lr: float, column: str, gpt: dict[str, Any], run_root: str) -> dict:
    """symo train's run of a preset arm on the spec of the spec column `column` (NANOGPT_SPECS). The key of a
    gpt_muon run names no spec (those runs were made before gpt_true was), a gpt_true run's ends in /gpt_true;
    neither takes key_suffix: every nanoGPT run trained here was made with today's code."""
    spec = NANOGPT_SPECS[column]
    size = "x".join(str(gpt[k]) for k in ("n_layer", "n_embd", "n_head", "batch_size", "block_size", "steps"))
    return {"key": f"nanogpt/{arm}/lr{lr:g}/seed0/{size}" + ("" if spec == "gpt_muon" else f"/{spec}"),
            "variant": arm, "run_root": run_root,
            "config": {"optimizer": "symo", "spec": spec, "lr": lr, "seed": 0, **_arm_config(arm), **gpt}}


def _arm_config(arm: str) -> dict[str, Any]:
    """symo train's options of a preset arm (TrainConfig has `preset`, not `update_scale`)."""
    from benchmarks.preset_arms import preset_options

    options = preset_options(arm) or {}
    if "update_scale" in options:
        raise ValueError(f"{arm}: nanoGPT runs here take a preset as it is")
    return options


def nanogpt_cell(preset: str, results: Path, spec: str = "muon") -> Cell:
    """A nanoGPT cell of spec column `spec` read from nanogpt_compare / nanogpt_matrix results; source 'pending'
    when not there."""
    cell = Cell(preset, None, "nanogpt", spec=spec)
    file, regime, arm, differs = NANOGPT_SOURCES[spec][preset]
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
            jobs = [prob.job(prob.arm(c.preset, c.scale, c.spec), lr, c.spec) for c, lr in mine]
            for (c, _lr), job in zip(mine, jobs):
                job["key"] += key_suffix(c.preset, c.scale, c.spec) if prob.suffixed else ""
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


def uncovered_parameters(problem: str, spec: str) -> list[str]:
    """The parameters that small problem `problem`'s `spec` variant leaves to Symo's AdamW: the optimizer its
    benchmark builds for a preset arm on that spec (built, not trained)."""
    import torch

    from benchmarks import mlp_common as mc
    from benchmarks import paper_mlp, rnn_train, train_mlp
    from symo.train.rnn import RNN

    arm, lr = arm_name("muon", None, spec), GRID_CENTRE["muon"]
    if problem.startswith("train_mlp") or problem == "mnist_autoencoder":
        act = problem.split()[1] if problem.startswith("train_mlp") else "tanh"
        sizes = (100, 70, 40) if problem.startswith("train_mlp") else (784, 128, 32, 128, 784)  # train_mlp.problem's
        model = mc.make_mlp(sizes, act, 0, torch.float32)
        opts = [train_mlp.make_optimizer(arm, model, lr, act, 1)]
    elif problem.startswith("paper_mlp"):
        model = paper_mlp.Net(paper_mlp.SIZES, problem.split()[1])
        opts = [paper_mlp.make_optimizer(arm, model, problem.split()[1], lr)[0]]
    elif problem == "rnn_train":
        model = RNN(2, RNN_SHAPE[2], 1, act="tanh")
        opts = rnn_train.make_optimizers(arm, model, lr)
    else:
        raise ValueError(f"not a small problem: {problem!r}")
    names = {id(p): n for n, p in model.named_parameters()}
    return sorted(names[id(p)] for o in opts for g in o.param_groups if g.get("kind") == "adamw" for p in g["params"])


def main(argv: list[str] | None = None) -> int:
    from symo.optim.presets import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1, help="processes for the missing runs (one thread each)")
    ap.add_argument("--quick", action="store_true",
                    help="2 presets (muon alone on the Muon-style spec), 2 problems, 2-rate grids, to a temp dir")
    ap.add_argument("--out", type=Path, default=None, help="folder of the outputs and the run caches")
    args = ap.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="lr_transfer_")) if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    run_root = tempfile.mkdtemp(prefix="lr_transfer_runs_")  # nanoGPT's checkpoints, not kept
    probs = problems(out, args.quick, run_root)
    presets = ["muon", "notebook"] if args.quick else [p for p in PRESETS if p in GRID_CENTRE]
    small = ["paper_mlp tanh", "rnn_train"] if args.quick else list(SMALL)
    columns = small if args.quick else [*small, "nanogpt"]
    rows = {spec: spec_presets(spec, presets) for spec in SPECS}
    cells: dict[str, dict[tuple, Cell]] = {spec: {} for spec in SPECS}
    for spec in SPECS:
        for p in rows[spec]:
            for q in small:
                if not not_measured(p, spec, q):
                    cells[spec][(p, None, q)] = Cell(p, None, q, spec=spec)
    if not args.quick:  # nanoGPT's columns: gpt_true and gpt_muon (a Muon-style spec), every preset
        for spec in SPECS:
            for p in presets:
                if p in NANOGPT_SOURCES[spec]:
                    cells[spec][(p, None, "nanogpt")] = nanogpt_cell(p, RESULTS, spec)
                elif p in NANOGPT_TRAINED[spec] and not not_measured(p, spec, "nanogpt"):
                    cells[spec][(p, None, "nanogpt")] = Cell(p, None, "nanogpt", spec=spec)
        rows["muon"] = [p for p in presets if p in rows["muon"] or (p, None, "nanogpt") in cells["muon"]]
    todo = [c for spec in SPECS for c in cells[spec].values() if c.source == "trained"]
    used = run_cells(todo, probs, args.workers, args.quick)
    # the other update scales, on the true spec's small problems, for the presets whose best rates there spread
    wide = [p for p in rows["true"]
            if (spread([c for (pp, _s, _q), c in cells["true"].items() if pp == p]) or 1.0) > SPREAD_LIMIT * ROUNDING]
    alt = {(p, s, q): Cell(p, s, q, spec="true") for p in wide for s in accepted_scales(p) for q in small
           if not not_measured(p, "true", q)}
    used += run_cells(list(alt.values()), probs, args.workers, args.quick)
    shutil.rmtree(run_root, ignore_errors=True)
    cells["true"].update(alt)
    documented = {p: PRESETS[p].lr for p in presets}
    data = summarise_specs({spec: summarise(cells[spec], rows[spec], small, documented, spec=spec, columns=columns)
                            for spec in SPECS})
    data["meta"] = {"command": "python -m benchmarks.lr_transfer" + (" --quick" if args.quick else ""),
                    "wall_s": time.time() - t0, "runs": used, "workers": args.workers,
                    "run_seconds": sum(c.seconds for spec in SPECS for c in cells[spec].values()),
                    "grid_centre": GRID_CENTRE, "scale_centre": SCALE_CENTRE, "factor": FACTOR,
                    "extensions": EXTENSIONS, "muon_style_presets": list(MUON_STYLE_PRESETS),
                    "presets_not_measured": [p for p in PRESETS if p not in GRID_CENTRE]}
    write_results(out, NAME, markdown(data), data)
    print((out / f"{NAME}.md").read_text())
    return 0


# ------------------------------------------------------------------ report
def summarise(cells: dict[tuple, Cell], presets: list[str], small: list[str], documented: dict[str, float],
              spec: str = "true", columns: list[str] | None = None) -> dict:
    """One spec's table: cells {(preset, scale or None, problem): Cell} of that spec."""
    columns = list(columns) if columns is not None else list(dict.fromkeys(
        [*small, *(q for (_p, s, q) in cells if s is None)]))
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
            "not_measured": {q: why for q in columns if q not in own and (why := not_measured(p, spec, q))},
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
    return {"spec": spec, "label": SPEC_LABEL.get(spec, spec), "columns": columns, "presets": table,
            "goal": f"best / documented within {GOAL:g}x everywhere",
            "goal_met": all(within), "cells_within_goal": sum(within), "cells_measured": len(within)}


def summarise_specs(per_spec: dict[str, dict]) -> dict:
    """The spec tables (summarise's) and the goal over all of them."""
    return {"specs": per_spec, "goal": f"best / documented within {GOAL:g}x everywhere, per spec",
            "goal_met": all(t["goal_met"] for t in per_spec.values()),
            "cells_within_goal": sum(t["cells_within_goal"] for t in per_spec.values()),
            "cells_measured": sum(t["cells_measured"] for t in per_spec.values())}


def within_goal(cell: dict) -> bool:
    """best / documented within GOAL either way; a best still at a grid edge (a bound) does not count."""
    return not cell["bound"] and abs(math.log(cell["ratio"])) <= math.log(GOAL * ROUNDING)


def _ratio_text(c: dict) -> str:
    if c["ratio"] is None:
        return "pending" if c["source"].startswith("pending") else "-"
    r = c["ratio"]
    text = f"{r:.2g}x" if r >= 0.095 else f"1/{1 / r:.2g}x"
    return f"{c['bound']}{text}"


def cell_text(t: dict, q: str, text: Callable[[dict], str]) -> str:
    """A table cell of problem `q` in preset row `t`: `text` of a measured cell, else why it is not measured."""
    if q in t["cells"]:
        return text(t["cells"][q])
    return "not measured" if q in t.get("not_measured", {}) else "-"


def _processes(workers: int) -> str:
    return "one process" if workers <= 1 else f"{workers} processes"


def _goal_text(x: dict) -> str:
    return f"{'met' if x['goal_met'] else 'not met'}, {x['cells_within_goal']} of {x['cells_measured']} cells"


def markdown(data: dict) -> str:
    meta, specs = data["meta"], data["specs"]
    problems_seen = list(dict.fromkeys(q for t in specs.values() for q in t["columns"]))
    small = [q for q in problems_seen if q != "nanogpt"]
    muon_style = ", ".join(meta.get("muon_style_presets", MUON_STYLE_PRESETS))
    lines = ["# Learning-rate transfer: each preset's best rate over its documented one", "",
             f"Command: `{meta['command']}` ({meta['runs']} runs, {meta['run_seconds'] / 60:.0f} min of training "
             f"recorded in them, {_processes(meta.get('workers', 1))} with one thread each on 2 shared CPU cores; "
             "this invocation took "
             f"{meta['wall_s'] / 60:.0f} min, the runs its caches held were not trained again).", "",
             "Per preset, spec and problem: a factor-3 grid of 3 rates centred on the rate the preset was "
             "documented with when this was measured (column `grid centre` below), seed 0, the benchmark's own "
             "model, data, length, schedule and metric (final test loss; the RNN's final eval MSE; nanoGPT's final "
             "validation loss); a best rate at an edge extends the grid by one point, at most twice, and `>=`/`<=` "
             "marks a best still at an edge after that (such a cell does not count as within the goal). "
             "paper_mlp's preset runs use a constant rate (as its tuned rows do; its `symo` row uses the paper's "
             "decaying schedule). nanoGPT cells: see the sources below; those without one are trained here.", "",
             "Two specs per problem. **True-symmetry spec**: each benchmark's own spec, the network's true group "
             "(hidden units permuted; every preset on the small problems). **Muon-style spec**: a private "
             "signed_perm row space per weight matrix, the rest (biases) to Symo's AdamW, whose rate follows lr "
             "(3e-3 at the preset's documented rate): specs/muon.toml on the MLPs (train_mlp, the autoencoder, "
             "paper_mlp, every weight matrix as each benchmark's own Muon baseline), specs/rnn_muon.toml on the RNN; "
             f"measured for {muon_style} (the other presets on the true spec only). "
             "`symo.infer.training_spec` was not used: it leaves the first layer and the classifier to AdamW, "
             "which on train_mlp's and paper_mlp's two-layer networks is every weight, and cannot guess the RNN's "
             "inputs. nanoGPT's columns: gpt_true on the true-symmetry spec (per-head O(d_head) on attention, perm "
             "on each MLP's hidden units; embeddings, gains and attention/MLP output biases to AdamW), gpt_muon on "
             "the Muon-style spec, every preset on both; their runs, by `symo train`, give the AdamW side a fixed "
             "3e-3. The campaign's gpt_true runs under Muon's scale (nanogpt_matrix's defaults, then_orthogonalize "
             "and SOAP-Muon arms) ran with `parameter_rms=False`, no longer the default, so the muon and "
             "then_orthogonalize cells on gpt_true are trained here, under today's default. soap on the autoencoder's "
             "true spec is the costliest cell (fc2 and fc3, both axes permuted, are each one block whose two-sided "
             "factor is 4096 x 4096: about 8 min a run on a loaded core). Not measured: "
             + "; ".join(f"the preset {p}" for p in meta.get("presets_not_measured", [])) + ". "
             "Runs whose code changed after the committed run caches were made carry a new cache key: true-spec "
             "runs under Muon's scale (`/parameter_rms`: a parameter whose blocks are not its own rows x cols now "
             "moves at Muon's per-shape RMS) and eigen_adam's true-spec runs (`/soap_conventions`: the kind now "
             "defaults to SOAP's conventions). The other true-spec runs are the cached ones (today's code "
             "reproduces them bit for bit); every small problem's true spec covers all its parameters, so the "
             "AdamW side's new rate changes none of them.", "",
             f"## Best rate / documented rate (goal: within {GOAL:g}x everywhere, per spec: {_goal_text(data)})"]
    for st in specs.values():
        cols = st["columns"]
        lines += ["", f"### {st['label'][0].upper() + st['label'][1:]} (goal: {_goal_text(st)})", "",
                  "| preset | documented lr | " + " | ".join(cols) + " | within 3x |",
                  "|---|---:|" + "---:|" * len(cols) + "---|"]
        for p, t in st["presets"].items():
            ok = all(within_goal(c) for c in t["cells"].values() if c["ratio"])
            lines.append(f"| {p} | {t['documented']:g} | " + " | ".join(cell_text(t, q, _ratio_text) for q in cols)
                         + f" | {'yes' if ok else 'no'} |")
    lines += ["", "## Best rates and the recommendation", "",
              "The rate that makes the worst ratio smallest is the geometric midpoint of a preset's best rates on "
              "one spec (rounded to 1, 1.5, 2, 3, 5 or 7 x 10^k); `worst ratio` is the largest of best/rate and "
              "rate/best over that spec's measured cells.", "",
              "| preset | spec | grid centre | " + " | ".join(problems_seen) + " | spread | recommended | worst ratio "
              "at recommended | at grid centre |",
              "|---|---|---:|" + "---:|" * len(problems_seen) + "---:|---:|---:|---:|"]

    def best_text(c: dict) -> str:
        return f"{c['bound']}{c['best_lr']:g}" if c["best_lr"] else "pending"

    for spec, st in specs.items():
        for p, t in st["presets"].items():
            worst_c = max((max(c["best_lr"] / t["grid_centre"], t["grid_centre"] / c["best_lr"])
                           for c in t["cells"].values() if c["best_lr"]), default=None)
            lines.append(f"| {p} | {spec} | {t['grid_centre']:g} | "
                         + " | ".join(cell_text(t, q, best_text) for q in problems_seen) + " | "
                         + (f"{t['spread']:.3g}x | {t['recommended']:g} | {t['worst_ratio_at_recommended']:.2g}x | "
                            f"{worst_c:.2g}x |" if t["spread"] else "- | - | - | - |"))
    true = specs.get("true", {"presets": {}})["presets"]
    alt_rows = [(p, s, a) for p, t in true.items() for s, a in t["update_scales"].items()]
    if alt_rows:
        lines += ["", f"## Other update scales for the presets whose best rates on the true spec spread over "
                  f"{SPREAD_LIMIT:g}x", "",
                  "The same true-spec grids on the small problems under the update scales the preset's kind "
                  "accepts: `adamw` rescales each block's update to RMS 0.2 (AdamW's rates, grid centred on "
                  "3e-3), `muon` is Muon's shape scale (grid centred on 0.02). A preset keeps its own scale; "
                  "these are measured alternatives (not measured on the Muon-style spec). Cells: best rate (its "
                  "final loss / the final loss of the preset's own scale at its best rate).", "",
                  "| preset | scale | " + " | ".join(small) + " | spread | spread at own scale | recommended |",
                  "|---|---|" + "---:|" * len(small) + "---:|---:|---:|"]
        for p, s, a in alt_rows:
            cells = []
            for q in small:
                c = a["cells"].get(q)
                if not c or c["best_lr"] is None:
                    cells.append("not measured" if q in true[p].get("not_measured", {}) else "-")
                    continue
                rel = (f" ({c['final'] / c['own_scale_final']:.2g})" if c["own_scale_final"] and
                       math.isfinite(c["final"]) and c["own_scale_final"] > 0 else "")
                cells.append(f"{c['bound']}{c['best_lr']:g}{rel}")
            spread_own = true[p]["spread_small"]
            lines.append(f"| {p} | {s} | " + " | ".join(cells) + f" | {a['spread_small']:.3g}x | "
                         + (f"{spread_own:.3g}x" if spread_own else "-") + f" | {a['recommended']:g} |")
    lines += ["", "## Grids (seed 0: rate: final loss)", ""]
    for spec, st in specs.items():
        for p, t in st["presets"].items():
            for q, c in t["cells"].items():
                grid = ", ".join(f"{lr}: {v:.4g}" for lr, v in c["grid"].items()) or c["source"]
                src = "" if c["source"] == "trained" else f" ({c['source']})"
                lines.append(f"- {p}, {spec} spec, {q}{src}: {grid}")
            for q, why in t.get("not_measured", {}).items():
                if (p, spec, q) in NOT_MEASURED:
                    lines.append(f"- {p}, {spec} spec, {q}: {why}")
            for s, a in t["update_scales"].items():
                for q, c in a["cells"].items():
                    lines.append(f"- {p} at update_scale={s}, {spec} spec, {q}: "
                                 + ", ".join(f"{lr}: {v:.4g}" for lr, v in c["grid"].items()))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
