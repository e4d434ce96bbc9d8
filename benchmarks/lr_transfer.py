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
benchmarks/results/nanogpt_compare.json (factor-2 grids; the muon preset with the gpt_muon spec is Muon, whose row
it takes), the published, eigen_adam, soap, then_orthogonalize and soap_muon cells come from the screening pass of
benchmarks/results/nanogpt_matrix.json (the same small size; eigen_adam's is the arm one_sided_soap, the preset as
it is now; soap_muon's the arm soap_muon, whose options are the preset's) once an arm's grid has finished there,
"pending" otherwise, and shampoo is trained here. On gpt_true, the published, eigen_adam and soap cells are that
screening pass's gpt_true arms; muon, then_orthogonalize, notebook, shampoo and soap_muon are trained here (the
campaign's gpt_true arms under Muon's scale ran with parameter_rms=False, no longer the default). Trained here
means benchmarks.nanogpt_compare.run_one, i.e. symo train with the spec and the preset; a gpt_true run's key ends
in "/gpt_true" (nanogpt_job). All these runs give the AdamW side a fixed 3e-3.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import RunCache, run_pool, write_results
from benchmarks.lr_transfer_grid import (
    EXTENSIONS,
    FACTOR,
    GRID_CENTRE,
    MUON_STYLE_PRESETS,
    NANOGPT_SOURCES,
    NANOGPT_SPECS,
    NANOGPT_TRAINED,
    ROUNDING,
    SCALE_CENTRE,
    SMALL,
    SPREAD_LIMIT,
    Cell,
    first_grid,
    key_suffix,
    not_measured,
    spec_presets,
    spread,
)
from benchmarks.lr_transfer_report import markdown, summarise, summarise_specs
from benchmarks.preset_arms import SPECS, arm_name

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "lr_transfer"
RNN_SHAPE = (600, 20, 32, 64)  # steps, length, hidden, batch: rnn_train's committed command


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
            "config": {"optimizer": "symo", "spec": spec, "lr": lr, "seed": 0, "weight_decay": 0.0,  # rates alone
                       **_arm_config(arm), **gpt}}


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


if __name__ == "__main__":
    raise SystemExit(main())
