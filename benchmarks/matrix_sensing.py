"""Underdetermined matrix sensing (Singh 2026, protocol §1-3): the optimizer zoo, the minimum-nuclear-norm
reference, the anisotropy dial, and the spectral tail, with each rule's gauge-equivariance verdict from
`symo.check_equivariance`.

    python benchmarks/matrix_sensing.py --part zoo         # then nuclear, dial, tail (or --part all)
    python benchmarks/matrix_sensing.py --quick            # seconds: every part at toy length, to a temp dir

40 x 40 target of rank 3, factors 40 x 40, m = 462 Gaussian measurements, init 1e-3, seeds 42 123 456,
float32 on CPU. Independent runs go to a process pool of 2 (one thread each). Each part updates
benchmarks/results/matrix_sensing.json and rewrites .md and .png from everything that file holds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

import torch

from symo.train.progress import progress as tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sensing_core as sc  # noqa: E402

import symo  # noqa: E402

SEEDS = (42, 123, 456)
ZOO_GRIDS = {
    "gd": (0.01, 0.03, 0.1, 0.3),
    "adam": (1e-3, 1e-2, 3e-2),
    "scalar_adam": (1e-3, 3e-3, 1e-2, 3e-2),
    "rmsprop": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
    "signum": (1e-4, 3e-4, 1e-3, 3e-3),
    "lion": (1e-4, 3e-4, 1e-3, 3e-3),
    "adafactor": (3e-4, 1e-3, 3e-3, 1e-2),
    "muon": (3e-3, 1e-2, 3e-2, 0.1),
    "shampoo": (0.03, 0.1, 0.3, 1.0),
    "symo": (3e-3, 1e-2, 3e-2, 0.1),         # ours: Adam-scale updates (RMS ~0.7)
    "symo_ema": (3e-3, 1e-2, 3e-2, 0.1),
}
DIAL_PS = (1.0, 0.75, 0.5, 0.25, 0.0)
DIAL_GRID = (1e-3, 3e-3, 1e-2, 3e-2, 0.1)
DIAL_STEPS = 30_000
TAUS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5)
TAIL_GRIDS = {"gd": (0.01, 0.03), "adam": (3e-3, 0.01), "muon": (0.03, 0.1), "shampoo": (0.03, 0.1),
              "scalar_adam": (1e-3, 3e-3), "symo": (0.003, 0.01, 0.03)}
RESULTS = Path(__file__).resolve().parent / "results"


def _worker_init() -> None:
    torch.set_num_threads(1)


def _run(task: dict) -> dict:
    task = dict(task)
    kind = task.pop("kind", "single")
    if kind == "batched":
        return sc.train_batched(**task)
    return sc.train(**task)


def run_pool(tasks: list[dict], desc: str, workers: int, partial: Path | None = None) -> list:
    """Results in completion order; with `partial`, every result so far is also dumped there (JSON)."""
    done: list = []

    def keep(result):
        done.append(result)
        if partial is not None:
            partial.write_text(json.dumps(done))

    if workers <= 1:
        _worker_init()
        for t in tqdm(tasks, desc=desc):
            keep(_run(t))
        return done
    with get_context("spawn").Pool(workers, initializer=_worker_init) as pool:
        for r in tqdm(pool.imap_unordered(_run, tasks), total=len(tasks), desc=desc):
            keep(r)
    return done


def _mean(xs):
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.fmean(xs) if xs else float("inf")


def _std(xs):
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.pstdev(xs) if len(xs) > 1 else 0.0


def verdict(rule: str) -> dict:
    """check_equivariance on the small factored problem (float64, 20 lockstep steps)."""
    lr = sc.zoo.RULES[rule][1] if rule in sc.zoo.RULES else 1e-2
    rep = symo.check_equivariance(lambda ps: sc.build(rule, ps, lr), steps=20)
    return {"equivariant": rep.is_equivariant, "first_step_defect": rep.first_step_defect,
            "final_divergence": rep.final_divergence}


# ------------------------------------------------------------------ parts
def part_zoo(quick: bool, workers: int, grids: dict | None = None) -> dict:
    seeds = SEEDS[:1] if quick else SEEDS
    steps = 400 if quick else sc.MAX_STEPS
    if grids is None:
        grids = {r: g[len(g) // 2: len(g) // 2 + 1] for r, g in ZOO_GRIDS.items()} if quick else ZOO_GRIDS
    tasks = [{"rule": r, "lr": lr, "seed": s, "max_steps": steps, "schedule": sc.schedule_of(r)}
             for r, grid in grids.items() for lr in grid for s in seeds]
    runs = run_pool(tasks, "zoo", workers)
    return {"zoo": summarize_zoo(runs), "zoo_runs": runs}


def summarize_zoo(runs: list[dict]) -> dict:
    zoo = {}
    for rule in dict.fromkeys(r["rule"] for r in runs):
        grid = sorted({r["lr"] for r in runs if r["rule"] == rule})
        lr, best = sc.select_lr([r for r in runs if r["rule"] == rule])
        zoo[rule] = {"lr": lr, "recovery_mean": _mean([r["recovery"] for r in best]),
                     "recovery_std": _std([r["recovery"] for r in best]),
                     "erank_mean": _mean([r["erank"] for r in best]),
                     "balancedness_mean": _mean([r["balancedness"] for r in best]),
                     "steps_mean": _mean([r["steps"] for r in best]),
                     "final_loss_max": max(r["final_loss"] for r in best),
                     "lr_at_grid_edge": lr in (grid[0], grid[-1]) and len(grid) > 1, "grid": grid,
                     **verdict(rule)}
    return zoo


def part_nuclear(quick: bool, workers: int) -> dict:
    seeds = SEEDS[:1] if quick else SEEDS
    recs, eranks = [], []
    for s in tqdm(seeds, desc="nuclear"):
        # quick: a 12 x 12 rank-2 problem (the 40 x 40 solve takes ~40 s per seed)
        x, a, y = sc.make_problem(s, n=12, rank=2, m=2 * 2 * (24 - 2)) if quick else sc.make_problem(s)
        w = sc.nuclear_norm_interpolant(a, y, tuple(x.shape)).to(torch.float32)
        recs.append(float((w - x).norm() / x.norm()))
        eranks.append(sc.effective_rank(w))
    return {"nuclear_norm": {"recovery_mean": _mean(recs), "recovery_std": _std(recs), "erank_mean": _mean(eranks),
                             "per_seed": recs}}


def part_dial(quick: bool, workers: int, grid=DIAL_GRID) -> dict:
    seeds = list(SEEDS[:1] if quick else SEEDS)
    steps = 400 if quick else DIAL_STEPS
    grid = list(grid[2:3] if quick else grid)
    tasks = [{"kind": "batched", "rule": "adam_p", "lrs": [lr], "seeds": seeds, "p": p, "max_steps": steps}
             for p in DIAL_PS for lr in grid]
    runs = [r for rs in run_pool(tasks, "dial", workers) for r in rs]
    return {"dial": summarize_dial(runs), "dial_runs": runs}


def summarize_dial(runs: list[dict]) -> list[dict]:
    dial = []
    for p in sorted({r["p"] for r in runs}, reverse=True):
        sel = [r for r in runs if r["p"] == p]
        grid = sorted({r["lr"] for r in sel})
        lr, best = sc.select_lr(sel)
        dial.append({"p": p, "lr": lr, "recovery_mean": _mean([r["recovery"] for r in best]),
                     "recovery_std": _std([r["recovery"] for r in best]),
                     "erank_mean": _mean([r["erank"] for r in best]), "steps_mean": _mean([r["steps"] for r in best]),
                     "lr_at_grid_edge": lr in (grid[0], grid[-1]) and len(grid) > 1, "grid": grid})
    return dial


# Symo's power as a dial between momentum GD (p = 0) and the Gram polar rule (p = -1/2), fixed or
# scheduled linearly over the first 2000 steps (ours, beyond the paper).
# An arm's "lrs" replaces the Symo grid of TAIL_GRIDS: at p = -1/4 the update scales with the gradient's
# square root, so its rates sit higher (0.03 was the best of 0.003-0.03 at tau = 0, at the edge).
SYMO_TAIL_ARMS = {
    "symo": {"p": -0.5},
    "symo_cos": {"p": -0.5, "schedule": "cos"},  # decayed like Muon in this protocol
    "symo_p-0.25": {"p": -0.25, "lrs": (0.03, 0.1, 0.3)},
    "symo_sched_-0.5_to_0": {"p": -0.5, "p_schedule": (-0.5, 0.0, 2000)},
}


def part_tail(quick: bool, workers: int, taus=TAUS, arms: tuple[str, ...] | None = None,
              max_steps: int = sc.MAX_STEPS, partial: Path | None = None, grids: dict | None = None) -> dict:
    """`grids` (rule or Symo arm -> rates) replaces those rules' grids, to extend them (merge afterwards)."""
    grids = grids or {}
    seeds = list(SEEDS[:1] if quick else SEEDS)
    steps = 300 if quick else max_steps
    taus = taus[::4] if quick else taus
    tasks = []
    for tau in taus:
        for rule, grid in TAIL_GRIDS.items():
            grid = list(grid[:1] if quick else grid)
            if rule == "symo":
                for label, arm in SYMO_TAIL_ARMS.items():
                    if arms is not None and label not in arms:
                        continue
                    arm = dict(arm)
                    lrs = list(grids.get(label, arm.pop("lrs", grid)))
                    arm.pop("lrs", None)
                    tasks.append({"kind": "batched", "rule": "symo_p", "lrs": lrs[:1] if quick else lrs, "seeds": seeds,
                                  "tau": tau, "max_steps": steps, "label": label, **arm})
            elif arms is None or rule in arms:
                grid = list(grids.get(rule, grid))
                tasks.append({"kind": "batched", "rule": rule, "lrs": grid, "seeds": seeds, "tau": tau,
                              "max_steps": steps, "schedule": sc.schedule_of(rule, tail=True)})
    runs = [r for rs in run_pool(tasks, "tail", workers, partial) for r in rs]
    return {"tail": summarize_tail(runs), "tail_runs": runs}


def summarize_tail(runs: list[dict]) -> list[dict]:
    tail = []
    for tau in sorted({r["tau"] for r in runs}):
        for label in sorted({r["rule"] for r in runs}):
            sel = [r for r in runs if r["rule"] == label and r["tau"] == tau]
            if not sel:
                continue
            grid = sorted({r["lr"] for r in sel})
            lr, best = sc.select_lr(sel)
            tail.append({"tau": tau, "rule": label, "lr": lr, "recovery_mean": _mean([r["recovery"] for r in best]),
                         "recovery_std": _std([r["recovery"] for r in best]),
                         "erank_mean": _mean([r["erank"] for r in best]),
                         "steps_mean": _mean([r["steps"] for r in best]),
                         "lr_at_grid_edge": lr in (grid[0], grid[-1]) and len(grid) > 1, "grid": grid})
    return tail


# ------------------------------------------------------------------ outputs
def write_outputs(data: dict, out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "matrix_sensing.json.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, out / "matrix_sensing.json")
    (out / "matrix_sensing.md").write_text(render_md(data, command))
    plot(data, out / "matrix_sensing.png")


def render_md(data: dict, command: str) -> str:
    lines = ["# Matrix sensing: the optimizer zoo, the dial and the spectral tail", "",
             "40 x 40 rank-3 target, factors 40 x 40 (k = 40), m = 462 Gaussian measurements, init 1e-3, "
             "seeds 42/123/456, float32 (the published protocol, §1-3). The learning rate of each rule is selected by "
             "the protocol's rule, i.e. **against the ground truth** (mean recovery if every seed interpolates).",
             "", "Commands: " + "; ".join(f"`{c}`" for c in data.get("commands", [command])), ""]
    if "zoo" in data:
        lines += ["## The zoo (sorted by recovery error)", "",
                  "| rule | lr | recovery (mean ± std) | eff. rank | balancedness | steps | max final loss "
                  "| equivariant (O(k) gauge) | step-1 defect |",
                  "|---|---|---|---|---|---|---|---|---|"]
        rows = sorted(data["zoo"].items(), key=lambda kv: kv[1]["recovery_mean"])
        for rule, z in rows:
            edge = " (grid edge)" if z.get("lr_at_grid_edge") else ""
            lines.append(f"| {rule} | {z['lr']:g}{edge} | {z['recovery_mean']:.4f} ± {z['recovery_std']:.4f} | "
                         f"{z['erank_mean']:.2f} | {z['balancedness_mean']:.2e} | {z['steps_mean']:.0f} | "
                         f"{z['final_loss_max']:.1e} | {'yes' if z['equivariant'] else 'no'} | "
                         f"{z['first_step_defect']:.1e} |")
        if "nuclear_norm" in data:
            nn = data["nuclear_norm"]
            lines.append(f"| min nuclear norm (cvxpy) | - | {nn['recovery_mean']:.4f} ± {nn['recovery_std']:.4f} | "
                         f"{nn['erank_mean']:.2f} | - | - | - | - | - |")
        lines.append("")
    if "dial" in data:
        lines += ["## The anisotropy dial (Adam-p; p = 1 Adam, p = 0 shared-scalar Adam)", "",
                  "| p | lr | recovery | eff. rank | steps |", "|---|---|---|---|---|"]
        for d in data["dial"]:
            edge = " (grid edge)" if d.get("lr_at_grid_edge") else ""
            lines.append(f"| {d['p']:g} | {d['lr']:g}{edge} | {d['recovery_mean']:.4f} | {d['erank_mean']:.2f} | "
                         f"{d['steps_mean']:.0f} |")
        lines.append("")
    if "tail" in data:
        rules = sorted({t["rule"] for t in data["tail"]}, key=lambda r: (r.startswith("symo"), r))
        taus = sorted({t["tau"] for t in data["tail"]})
        lines += ["## The spectral tail: recovery error against tail energy tau^2 (columns: tau)", "",
                  "| rule | " + " | ".join(f"{t:g}" for t in taus) + " |", "|---" * (len(taus) + 1) + "|"]
        for r in rules:
            vals = {t["tau"]: (t["recovery_mean"], "*" if t.get("lr_at_grid_edge") else "")
                    for t in data["tail"] if t["rule"] == r}
            lines.append(f"| {r} | " + " | ".join("{:.4f}{}".format(*vals.get(t, (float("nan"), ""))) for t in taus)
                         + " |")
        lines += ["", "\\* the chosen rate is at an end of the rule's grid (the protocol's grids have two rates).", ""]
    for key in ("findings", "notes"):
        if key in data:
            lines += [f"## {key.capitalize()}", ""] + [f"- {x}" for x in data[key]] + [""]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("zoo", "dial", "tail") if k in data]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, key in zip(axes[0], panels):
        if key == "zoo":
            rows = sorted(data["zoo"].items(), key=lambda kv: kv[1]["recovery_mean"])
            colors = ["tab:blue" if z["equivariant"] else "tab:red" for _, z in rows]
            ax.barh([r for r, _ in rows], [min(z["recovery_mean"], 2.0) for _, z in rows], color=colors)
            if "nuclear_norm" in data:
                ax.axvline(data["nuclear_norm"]["recovery_mean"], color="k", ls="--", label="min nuclear norm")
                ax.legend()
            ax.set_xlabel("recovery error (blue: equivariant, red: not)")
        elif key == "dial":
            ps = [d["p"] for d in data["dial"]]
            ax.plot(ps, [d["recovery_mean"] for d in data["dial"]], "o-", label="recovery")
            ax2 = ax.twinx()
            ax2.plot(ps, [d["erank_mean"] for d in data["dial"]], "s--", color="tab:orange", label="eff. rank")
            ax.set_xlabel("p (1 = Adam, 0 = shared-scalar Adam)")
            ax.set_ylabel("recovery error")
            ax2.set_ylabel("effective rank")
        else:
            for r in sorted({t["rule"] for t in data["tail"]}):
                pts = sorted((t["tau"], t["recovery_mean"]) for t in data["tail"] if t["rule"] == r)
                ax.plot([p[0] ** 2 for p in pts], [p[1] for p in pts], "o-", label=r, ms=3)
            ax.set_xlabel("tail energy tau^2")
            ax.set_ylabel("recovery error")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax.set_title(key)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PARTS = {"zoo": part_zoo, "nuclear": part_nuclear, "dial": part_dial, "tail": part_tail}


def union_runs(old: list[dict], new: list[dict]) -> list[dict]:
    """old + new without repeats: a run is (rule, lr, seed, p, tau), and a repeat of one already held (a
    merge run twice) is dropped, so merging is idempotent and selection never counts a run twice."""
    def key(r: dict) -> tuple:
        return r["rule"], float(r["lr"]), r["seed"], r.get("p"), r.get("tau")

    seen = {key(r) for r in old}
    out = list(old)
    for r in new:
        if key(r) not in seen:
            seen.add(key(r))
            out.append(r)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", help="zoo, nuclear, dial, tail or all (comma-separated)")
    ap.add_argument("--quick", action="store_true", help="toy lengths, one seed, to a temp dir unless --out")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--merge-from", default=None,
                    help="comma-separated matrix_sensing.json files (parts run to other --out dirs) to merge into "
                         "--out's file; no training (zoo/dial runs join --out's runs; the tail runs of the merged "
                         "files together replace --out's tail)")
    ap.add_argument("--join-tail", action="store_true",
                    help="with --merge-from: the merged files' tail runs join --out's tail runs (a tail grid "
                         "extension; every (tau, rule) re-selected over the union) instead of replacing them")
    ap.add_argument("--notes-file", type=Path, default=None, help="with --merge-from: lines for the md's Notes")
    ap.add_argument("--replace-zoo-rules", default=None,
                    help="with --merge-from: comma-separated zoo rules whose runs in --out's file are dropped first, "
                         "so the merged files' runs of them replace them (a rule whose update rule changed)")
    ap.add_argument("--dial-grid", default=None, help="dial: comma-separated subset of learning rates")
    ap.add_argument("--zoo-grid", default=None,
                    help="zoo: rule=lr/lr,... instead of the protocol grids (to extend a grid; merge afterwards)")
    ap.add_argument("--tail-grid", default=None,
                    help="tail: rule=lr/lr,... (rules or Symo arms) instead of their grids (to extend; merge later)")
    ap.add_argument("--tail-steps", type=int, default=None, help="tail: step cap (protocol: 20000)")
    ap.add_argument("--taus", default=None, help="tail: comma-separated subset of tau (default: the protocol's 8)")
    ap.add_argument("--tail-arms", default=None,
                    help="tail: comma-separated subset of rules/Symo arms (default: all)")
    args = ap.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="matrix_sensing_")) if args.quick else RESULTS)
    parts = list(PARTS) if args.part == "all" else args.part.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"--part: unknown {unknown}; choose from {list(PARTS)} or all")
    command = "python benchmarks/matrix_sensing.py " + " ".join(argv if argv is not None else sys.argv[1:])
    path = out / "matrix_sensing.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("commands", [])
    if args.merge_from:
        tail_runs: list[dict] = []
        if args.replace_zoo_rules:
            dropped = set(args.replace_zoo_rules.split(","))
            data["zoo_runs"] = [r for r in data.get("zoo_runs", []) if r["rule"] not in dropped]
        for other in args.merge_from.split(","):
            extra = json.loads(Path(other).read_text())
            for c in extra.pop("commands", []):
                if c not in data["commands"]:
                    data["commands"].append(c)
            data.setdefault("seconds", {}).update(extra.pop("seconds", {}))
            if "zoo_runs" in extra and "zoo_runs" in data:  # a grid extension: select over the union
                extra["zoo_runs"] = union_runs(data["zoo_runs"], extra["zoo_runs"])
                extra["zoo"] = summarize_zoo(extra["zoo_runs"])
            if "dial_runs" in extra and "dial_runs" in data:  # two grids of the dial: select over their union
                extra["dial_runs"] = union_runs(data["dial_runs"], extra["dial_runs"])
                extra["dial"] = summarize_dial(extra["dial_runs"])
            tail_runs += extra.pop("tail_runs", [])
            extra.pop("tail", None)
            data.update(extra)
        if tail_runs:  # the merged files' tail runs together replace the tail of --out's file (or join it)
            if args.join_tail:
                tail_runs = union_runs(data.get("tail_runs", []), tail_runs)
            data["tail_runs"], data["tail"] = tail_runs, summarize_tail(tail_runs)
        if args.notes_file:
            data["notes"] = [x.strip() for x in args.notes_file.read_text().splitlines() if x.strip()]
        write_outputs(data, out, data["commands"][-1])
        print((out / "matrix_sensing.md").read_text())
        return data
    for part in parts:
        t0 = time.time()
        kwargs = {}
        if part == "tail" and args.taus:
            kwargs["taus"] = tuple(float(t) for t in args.taus.split(","))
        if part == "zoo" and args.zoo_grid:
            kwargs["grids"] = {k: tuple(float(x) for x in v.split("/"))
                               for k, v in (item.split("=") for item in args.zoo_grid.split(","))}
        if part == "dial" and args.dial_grid:
            kwargs["grid"] = tuple(float(x) for x in args.dial_grid.split(","))
        if part == "tail":
            out.mkdir(parents=True, exist_ok=True)
            kwargs["partial"] = out / "tail_partial.json"
            if args.tail_steps:
                kwargs["max_steps"] = args.tail_steps
        if part == "tail" and args.tail_grid:
            kwargs["grids"] = {k: tuple(float(x) for x in v.split("/"))
                               for k, v in (item.split("=") for item in args.tail_grid.split(","))}
        if part == "tail" and args.tail_arms:
            kwargs["arms"] = tuple(args.tail_arms.split(","))
        data.update(PARTS[part](args.quick, args.workers, **kwargs))
        data.setdefault("seconds", {})[part] = round(time.time() - t0, 1)
        if command not in data["commands"]:
            data["commands"].append(command)
        write_outputs(data, out, command)
    print((out / "matrix_sensing.md").read_text())
    return data


if __name__ == "__main__":
    main()
