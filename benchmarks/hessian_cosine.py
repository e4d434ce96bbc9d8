"""How well do curvature estimates point the way the true Hessian does? (metrics in docs/hessian.md)

Small MLPs are trained with Adam on minibatches; every estimator is fed the same stream of minibatch
gradients (EMA beta = 0.95 for all). At three points of the run (early, middle, late) each estimate
is compared with the true full-training-set Hessian (torch.func, float64) by `symo.hessian.compare`:
cos(H_hat(-g), H(-g)), the mean cosine over random directions, the Newton cosine
cos(H_hat^{-1} g, H^{-1} g) (both damped relatively by DAMPING) and the Frobenius cosine.

Estimators: Symo H_g = S_g^{1/2} with the true network group, with the Muon-style per-matrix group,
and with the group restricted to the inner layers (benchmarks/mlp_common.py), Symo from the current
full-batch gradient alone (the paper's single-gradient estimate), Symo-taylor (S_w^{-1} # S_g, true
group), Shampoo (two-sided), K-FAC (empirical Fisher factors), Adam's diagonal sqrt(v), identity.

    python -m benchmarks.hessian_cosine            # ~20 min on 2 busy cores; --quick for a smoke run

Every run goes to a run cache, hessian_cosine_runs.json beside the outputs (benchmarks/harness.py): an
invocation trains only the runs it lacks.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

import symo
from benchmarks import mlp_common as mc
from benchmarks.harness import RunCache, run_pool, write_results
from symo import hessian

RESULTS = Path(__file__).resolve().parent / "results"
DAMPING = 1e-3          # relative damping of both inverses in the Newton cosine
BETA = 0.95             # one EMA for every estimator's statistics
METRICS = ("cos_neg_grad", "cos_newton", "cos_random", "cos_frobenius")

# (task, model label, layer sizes, activation)
MODELS = [
    ("teacher_student", "tanh 8-32-32-4", (8, 32, 32, 4), "tanh"),
    ("teacher_student", "tanh 8-24-24-24-4", (8, 24, 24, 24, 4), "tanh"),
    ("teacher_student", "relu 8-32-32-4", (8, 32, 32, 4), "relu"),
    ("teacher_student", "linear 8-32-32-4", (8, 32, 32, 4), "linear"),
    ("digits", "tanh 64-16-16-10", (64, 16, 16, 10), "tanh"),
    ("digits", "relu 64-16-16-10", (64, 16, 16, 10), "relu"),
]
ESTIMATORS = ["symo (true group)", "symo (Muon-style group)", "symo (inner layers)", "symo 1-grad (true group)",
              "symo-taylor (true group)", "shampoo", "kfac", "diagonal", "identity"]


class SymoStream:
    """EMA of Symo's S_g over the gradient stream; the estimate is H_g = S^{1/2}."""

    def __init__(self, compiled, beta: float) -> None:
        self.compiled, self.beta, self.steps, self.s = compiled, beta, 0, compiled.zeros()

    def update(self, grads) -> None:
        self.steps += 1
        self.s = self.beta * self.s + (1 - self.beta) * self.compiled.orbit_average(grads)

    def average(self):
        return self.s / (1 - self.beta ** self.steps)


def _run_job(job: dict) -> dict:
    """One run of the harness's pool."""
    return run_one(*job["args"])


def run_one(task: str, label: str, sizes: tuple[int, ...], act: str, seed: int, steps: int,
            points: dict[str, int]) -> dict:
    torch.set_num_threads(1)
    dtype = torch.float64
    if task == "teacher_student":
        x, y, _, _ = mc.teacher_student(sizes[0], sizes[-1], act, seed, dtype=dtype)
        loss_of, lr, batch = mc.mse, 3e-3, 64
    else:
        x, y, _, _ = mc.digits(seed, n_train=500, dtype=dtype)
        loss_of, lr, batch = mc.cross_entropy, 3e-3, 64
    model = mc.make_mlp(sizes, act, seed, dtype)
    group = mc.GROUP_OF_ACT[act]
    n_layers = len(sizes) - 1
    specs = {v: symo.compile(symo.parse_spec(mc.mlp_spec_toml(n_layers, group, v)), model)
             for v in ("true", "muon", "inner")}
    streams = {"symo (true group)": SymoStream(specs["true"], BETA),
               "symo (Muon-style group)": SymoStream(specs["muon"], BETA),
               "symo (inner layers)": SymoStream(specs["inner"], BETA)}
    names = [n for n, _ in model.named_parameters()]
    shapes = {n: p for n, p in model.named_parameters()}
    shampoo = hessian.Shampoo(shapes, beta=BETA)
    kfac = hessian.KFAC(model, beta=BETA)
    diag = hessian.Diagonal(shapes, beta=BETA)
    entries = {
        "symo (true group)": specs["true"].memory()["factors"],
        "symo (Muon-style group)": specs["muon"].memory()["factors"],
        "symo (inner layers)": specs["inner"].memory()["factors"],
        "symo 1-grad (true group)": specs["true"].memory()["single_gradient"],
        "symo-taylor (true group)": 2 * specs["true"].memory()["factors"],
        "shampoo": shampoo.factor_entries(), "kfac": kfac.factor_entries(),
        "diagonal": diag.factor_entries(), "identity": 0,
    }
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(40_000 + seed)

    def full_loss(p):
        return loss_of(torch.func.functional_call(model, p, (x,)), y)

    out = {"params": sum(p.numel() for p in model.parameters()), "factor_entries": entries, "points": {}}
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(x), (batch,), generator=gen)
        opt.zero_grad()
        kfac.recording = True
        loss = loss_of(model(x[idx]), y[idx])
        loss.backward()
        kfac.recording = False
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        for s in streams.values():
            s.update(grads)
        shampoo.update(grads)
        kfac.update()
        diag.update(grads)
        opt.step()
        for point, at in points.items():
            if step != at:
                continue
            params = {n: p.detach().clone() for n, p in model.named_parameters()}
            h_true = hessian.dense(full_loss, params)
            h_eigh = torch.linalg.eigh(h_true)
            g_full = hessian.gradient(full_loss, params)
            s_avg = streams["symo (true group)"].average()
            estimates = {k: s.average().power(0.5) for k, s in streams.items()}
            estimates["symo 1-grad (true group)"] = specs["true"].orbit_average(g_full).power(0.5)
            estimates["symo-taylor (true group)"] = hessian.taylor(s_avg, params)
            estimates.update({"shampoo": shampoo, "kfac": kfac, "diagonal": diag,
                              "identity": hessian.Identity(shapes)})
            res = {}
            for k in ESTIMATORS:
                res[k] = hessian.compare(estimates[k], full_loss, {n: params[n] for n in names}, damping=DAMPING,
                                         random_directions=8, seed=seed, hessian=h_true,
                                         hessian_eigh=h_eigh)
            out["points"][point] = {"step": step, "loss": float(full_loss(params)), "metrics": res}
    kfac.remove_hooks()
    return {"task": task, "model": label, "seed": seed, **out}


def summarise(runs: list[dict], points: list[str]) -> dict:
    results: dict = {}
    for task, label, sizes, act in MODELS:
        mine = [r for r in runs if r["task"] == task and r["model"] == label]
        if not mine:
            continue
        est = {}
        for k in ESTIMATORS:
            pts = {}
            for pt in points:
                pts[pt] = {}
                for m in METRICS:
                    vals = [r["points"][pt]["metrics"][k][m] for r in mine]
                    vals = [v for v in vals if v is not None]
                    pts[pt][m] = ([statistics.fmean(vals), statistics.pstdev(vals)] if vals else None)
            est[k] = {"factor_entries": int(mine[0]["factor_entries"][k]), "points": pts}
        results.setdefault(task, {})[label] = {
            "params": mine[0]["params"], "activation": act, "sizes": list(sizes), "group": mc.GROUP_OF_ACT[act],
            "seeds": sorted(r["seed"] for r in mine),
            "loss": {pt: statistics.fmean(r["points"][pt]["loss"] for r in mine) for pt in points},
            "estimators": est}
    return results


def markdown(results: dict, meta: dict) -> str:
    pts = meta["points"]
    lines = ["# Hessian cosine: curvature estimates against the true Hessian", "",
             f"Command: `{meta['command']}`  ", f"Seeds {meta['seeds']}; Adam-trained for {meta['steps']} steps "
             f"(batch 64); points (step): {pts}; every estimator sees the same minibatch gradients "
             f"(EMA beta {BETA}); true H on the full training set, float64; Newton damping {DAMPING} (relative). "
             f"Mean ± std over seeds. Wall time {meta['wall_s']:.0f} s.", "",
             "Columns: factor entries (stored numbers); cos(H_hat(-g), H(-g)); Newton cosine "
             "cos(H_hat^-1 g, H^-1 g); mean cosine over 8 random directions; Frobenius cosine. "
             "Metrics in docs/hessian.md.", ""]
    # summary over all models: mean of the per-model means
    lines += ["## Summary: mean over the models of each metric", "",
              "| estimator | " + " | ".join(f"-g {p}" for p in pts) + " | " + " | ".join(f"Newton {p}" for p in pts)
              + " | " + " | ".join(f"Frob {p}" for p in pts) + " |",
              "|---|" + "---:|" * (3 * len(pts))]
    for k in ESTIMATORS:
        row = []
        for m in ("cos_neg_grad", "cos_newton", "cos_frobenius"):
            for p in pts:
                vals = [mod["estimators"][k]["points"][p][m][0] for task in results.values() for mod in task.values()
                        if mod["estimators"][k]["points"][p][m] is not None]
                row.append(mc.fmt(statistics.fmean(vals)) if vals else "-")
        lines.append(f"| {k} | " + " | ".join(row) + " |")
    lines.append("")
    for task, models in results.items():
        for label, mod in models.items():
            lines += [f"## {task}: {label} (P = {mod['params']}, group {mod['group']})", "",
                      "train loss at the points: " + ", ".join(f"{p} {mod['loss'][p]:.4g}" for p in pts), "",
                      "| estimator | entries | " + " | ".join(f"-g {p}" for p in pts) + " | "
                      + " | ".join(f"Newton {p}" for p in pts) + " | " + " | ".join(f"random {p}" for p in pts)
                      + " | " + " | ".join(f"Frob {p}" for p in pts) + " |",
                      "|---|---:|" + "---:|" * (4 * len(pts))]
            for k in ESTIMATORS:
                e = mod["estimators"][k]
                row = []
                for m in METRICS:
                    for p in pts:
                        v = e["points"][p][m]
                        row.append(mc.fmt(*v, digits_=2) if v else "-")
                lines.append(f"| {k} | {e['factor_entries']:,} | " + " | ".join(row) + " |")
            lines.append("")
    return "\n".join(lines)


def plot(results: dict, meta: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [(t, lab, mod) for t, ms in results.items() for lab, mod in ms.items()]
    fig, axes = plt.subplots(2, len(models), figsize=(3.2 * len(models), 6.5), squeeze=False)
    pts = meta["points"]
    for j, (task, label, mod) in enumerate(models):
        for i, m in enumerate(("cos_neg_grad", "cos_newton")):
            ax = axes[i][j]
            for k in ESTIMATORS:
                vals = [mod["estimators"][k]["points"][p][m] for p in pts]
                ys = [v[0] if v else math.nan for v in vals]
                es = [v[1] if v else 0 for v in vals]
                style = "-" if k.startswith("symo") else "--"
                ax.errorbar(range(len(pts)), ys, yerr=es, fmt=style, marker="o", ms=3, label=k, capsize=2)
            ax.set_xticks(range(len(pts)), list(pts))
            ax.set_title(f"{label}\n{task}" if i == 0 else "", fontsize=8)
            ax.set_ylabel("cos(H_hat(-g), H(-g))" if m == "cos_neg_grad" else "Newton cosine", fontsize=8)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1 seed, 60 steps, two models: a smoke run")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    steps, seeds, models = args.steps, args.seeds, MODELS
    if args.quick:
        steps, seeds, models = 60, 1, [MODELS[0], MODELS[4]]
    points = {"early": max(1, steps // 50), "middle": max(2, steps * 3 // 20), "late": steps}
    jobs = [{"key": f"{t}/{lab}/{'x'.join(map(str, s))}/{a}/seed{seed}/steps{steps}/"
                    + ",".join(f"{k}{v}" for k, v in points.items()), "args": (t, lab, s, a, seed, steps, points)}
            for t, lab, s, a in models for seed in range(seeds)]
    t0 = time.time()
    out = Path(args.out)
    name = "hessian_cosine" + ("_quick" if args.quick else "")
    runs = run_pool(_run_job, jobs, RunCache(out / f"{name}_runs.json"), args.workers, "hessian_cosine runs")
    meta = {"command": "python -m benchmarks.hessian_cosine" + (" --quick" if args.quick else "")
            + (f" --seeds {args.seeds}" if args.seeds != 3 and not args.quick else "")
            + (f" --steps {args.steps}" if args.steps != 500 and not args.quick else ""),
            "seeds": list(range(seeds)), "steps": steps, "points": points, "beta": BETA, "damping": DAMPING,
            "wall_s": time.time() - t0}
    results = summarise(runs, list(points))
    write_results(out, name, markdown(results, meta), {"meta": meta, **results})
    plot(results, meta, out / f"{name}.png")
    print((out / f"{name}.md").read_text())


if __name__ == "__main__":
    main()
