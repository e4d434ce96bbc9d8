"""The paper's teacher-student experiment: a bias-free 100-70-40 MLP (tanh or linear), full batch, 100 updates.

- Model 100-70-40 without biases, tanh or identity; student and teacher weights drawn independently
  from N(0, 1/fan_in) (the teacher is not rescaled). Inputs x ~ N(0, Q diag(logspace(0, -5, 100)) Q^T),
  Q the orthogonal factor of a Gaussian matrix; 5000 train and 5000 test points; y = teacher(x), no noise.
- Loss ||out - y||^2 / N / 2; full batch; 100 updates; 3 seeds (a seed draws Q, data, teacher, student);
  model and data in float32.
- symo: `Symo(..., preset="notebook")`, one signed_perm hidden space (fc1 rows, fc2 columns; the same spec
  for the linear network), lr_t = alpha * beta^t (t = update index from 0). gd: lr 0.8. adam: lr 0.01.
- shampoo (paper_mlp_baselines.py): per weight matrix L += G G^T, R += G^T G from eps I, w -= lr L^{-1/4} G R^{-1/4}
  (powers by float64 SVD), lr 0.8.
- kfac (paper_mlp_baselines.py): per layer A = E[a a^T] (layer input), G = E[g g^T] (pre-activation gradient of the
  mean loss, the scale the paper's rates and dampings assume), EMA 0.9 (the first step sets them),
  damping on both, w -= lr (G + d I)^{-1} grad (A + d I)^{-1}.
- Extra rows: symo_float64 (model and data in float64); symo_stats_float32 (the preset with
  stats_dtype="float32"); kfac_per_point (G from N times those gradients, the per-point curvature, same
  rate and damping); symo_defaults (no preset, SymoConfig defaults, a constant lr tuned on seed 0 at 100
  updates on DEFAULTS_GRID, extended while the best rate sits at an edge); symo_published
  (preset="published", the published step, a constant lr tuned the same way on PUBLISHED_GRID).
All rates are the paper's (SETTINGS), not tuned here, except symo_defaults' and symo_published'. An arm named
"preset_<name>" is Symo with that preset as it is at a constant lr, "preset_<name>~muon" the same on
specs/muon.toml (a private row space per weight matrix) (benchmarks/preset_arms.py; benchmarks/lr_transfer.py
trains them).

    python -m benchmarks.paper_mlp          # 4-7 minutes on one thread
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

import symo
from benchmarks.harness import write_results
from benchmarks.paper_mlp_baselines import KFAC, Shampoo
from benchmarks.preset_arms import preset_options, preset_spec

RESULTS = Path(__file__).resolve().parent / "results"
MUON_SPEC = Path(__file__).resolve().parents[1] / "specs" / "muon.toml"  # preset arms "~muon": a row space per matrix
SIZES = (100, 70, 40)
CHECKPOINTS = (10, 20, 50, 100)
SETTINGS = {  # the paper's hyperparameters per activation
    "tanh": {"symo": {"alpha": 0.09, "beta": 0.91}, "gd": 0.8, "adam": 0.01, "shampoo": 0.8,
             "shampoo_eps": 1e-8, "kfac": 0.006, "kfac_damping": 0.017},
    "linear": {"symo": {"alpha": 0.05, "beta": 0.95}, "gd": 0.8, "adam": 0.01, "shampoo": 0.8,
               "shampoo_eps": 1e-10, "kfac": 1e-5, "kfac_damping": 1.3e-4},
}
OPTIMIZERS = ("symo", "gd", "adam", "shampoo", "kfac")
EXTRA = ("symo_float64", "symo_stats_float32", "kfac_per_point", "symo_defaults", "symo_published")
TUNED = {  # the arms with a constant lr tuned here: their starting grids, extended while the best is at an edge
    "symo_defaults": (1e-3, 3e-3, 1e-2, 3e-2),
    "symo_published": (0.01, 0.03, 0.1, 0.3),   # about the preset's recommended 0.1
}
PRESET_ARMS = {"symo_published": "preset_published"}  # the arms that are a Symo preset as it is
TARGETS = {"tanh": (20, 8.5e-3), "linear": (100, 1e-5)}  # Symo, float32, from the paper's figure


def spec_toml() -> str:
    """One signed_perm hidden space: fc1's rows and fc2's columns (no biases)."""
    return ('name = "bias-free MLP, one signed_perm hidden space"\n\n[spaces]\nh = { group = "signed_perm" }\n\n'
            '[params]\n"fc1.weight" = ["h", "_"]\n"fc2.weight" = ["_", "h"]\n')


class Net(nn.Module):
    """x -> fc2(act(fc1(x))), no biases; `cache` keeps each layer's input and pre-activation (for K-FAC)."""

    def __init__(self, sizes: tuple[int, int, int], act: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(sizes[0], sizes[1], bias=False)
        self.fc2 = nn.Linear(sizes[1], sizes[2], bias=False)
        self.act = torch.tanh if act == "tanh" else (lambda z: z)
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z1 = self.fc1(x)
        h = self.act(z1)
        z2 = self.fc2(h)
        if self.cache is not None:
            self.cache[:] = [(x, z1), (h, z2)]
        return z2


def init_normal(net: Net, gen: torch.Generator) -> Net:
    with torch.no_grad():
        for layer in (net.fc1, net.fc2):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen, dtype=torch.float64)
                               / math.sqrt(layer.in_features))
    return net


def problem(act: str, seed: int, sizes: tuple[int, int, int] = SIZES, n_train: int = 5000, n_test: int = 5000,
            dtype: torch.dtype = torch.float32):
    """-> (student, x_train, y_train, x_test, y_test), all in `dtype`. Drawn in float64, then cast."""
    gen = torch.Generator().manual_seed(1000 + seed)
    d = sizes[0]
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    scales = torch.logspace(0, -5, d, dtype=torch.float64).sqrt()
    x = torch.randn(n_train + n_test, d, generator=gen, dtype=torch.float64) @ (q * scales).T  # cov Q D Q^T
    teacher = init_normal(Net(sizes, act).double(), gen)
    student = init_normal(Net(sizes, act).double(), gen)
    with torch.no_grad():
        y = teacher(x)
    x, y = x.to(dtype), y.to(dtype)
    return student.to(dtype), x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).sum() / out.shape[0] / 2


# ------------------------------------------------------------------ one run
def make_optimizer(kind: str, net: Net, act: str, lr: float | None = None):
    """-> (optimizer, schedule(t) -> lr or None). `lr` overrides the paper's rate (symo_defaults)."""
    cfg = SETTINGS[act]
    if kind in ("symo", "symo_float64", "symo_stats_float32"):
        extra = {"stats_dtype": "float32"} if kind == "symo_stats_float32" else {}
        opt = symo.Symo(net.named_parameters(), symo.parse_spec(spec_toml()), preset="notebook", **extra)
        alpha, beta = cfg["symo"]["alpha"], cfg["symo"]["beta"]
        return opt, lambda t: alpha * beta ** t
    options = {} if kind == "symo_defaults" else preset_options(PRESET_ARMS.get(kind, kind))
    if options is not None:  # a constant lr: the defaults, or a preset as it is
        spec = MUON_SPEC if preset_spec(kind) == "muon" else symo.parse_spec(spec_toml())
        return symo.Symo(net.named_parameters(), spec, lr=lr, **options), None
    if kind == "gd":
        return torch.optim.SGD(net.parameters(), lr=cfg["gd"]), None
    if kind == "adam":
        return torch.optim.Adam(net.parameters(), lr=cfg["adam"]), None
    if kind == "shampoo":
        return Shampoo(net, cfg["shampoo"], cfg["shampoo_eps"]), None
    if kind in ("kfac", "kfac_per_point"):
        return KFAC(net, cfg["kfac"], cfg["kfac_damping"], per_point=kind == "kfac_per_point"), None
    raise ValueError(f"unknown optimizer {kind!r}; use one of {OPTIMIZERS + EXTRA} or preset_<name>")


def run(act: str, kind: str, seed: int, steps: int = 100, lr: float | None = None,
        sizes: tuple[int, int, int] = SIZES, n_train: int = 5000, n_test: int = 5000) -> list[float]:
    """Test loss after 0, 1, ..., `steps` updates (inf from the first non-finite value on)."""
    dtype = torch.float64 if kind == "symo_float64" else torch.float32
    net, x, y, xt, yt = problem(act, seed, sizes, n_train, n_test, dtype)
    opt, schedule = make_optimizer(kind, net, act, lr)
    curve = []
    for t in range(steps + 1):
        with torch.no_grad():
            test = float(mse(net(xt), yt))
        curve.append(test if math.isfinite(test) else math.inf)
        if t == steps or not math.isfinite(test):
            break
        if schedule is not None:
            for g in opt.param_groups:
                if g["kind"] == "symo":
                    g["lr"] = schedule(t)
        kfac = isinstance(opt, KFAC)
        net.cache = [] if kfac else None
        loss = mse(net(x), y)
        if kfac:
            opt.backward(loss)
        else:
            for p in net.parameters():
                p.grad = None
            loss.backward()
        opt.step()
        net.cache = None
    return curve + [math.inf] * (steps + 1 - len(curve))


def linear_fit_test_loss(act: str, seed: int, sizes: tuple[int, int, int] = SIZES, n_train: int = 5000,
                         n_test: int = 5000) -> float:
    """Test loss of the best linear map x -> W x (least squares on the training set, float64)."""
    _, x, y, xt, yt = problem(act, seed, sizes, n_train, n_test, torch.float64)
    w = torch.linalg.lstsq(x, y).solution
    return float(mse(xt @ w, yt))


def summarise(curves: list[list[float]], checkpoints: tuple[int, ...] = CHECKPOINTS) -> dict:
    def stat(fn, t: int) -> float:
        vals = [c[t] for c in curves]
        return fn(vals) if all(map(math.isfinite, vals)) else math.inf

    steps = len(curves[0]) - 1
    points = [t for t in checkpoints if t <= steps]
    return {"test_loss_mean": {str(t): stat(statistics.fmean, t) for t in points},
            "test_loss_std": {str(t): stat(statistics.pstdev, t) for t in points},
            "curve_mean": [stat(statistics.fmean, t) for t in range(steps + 1)],
            "curve_min": [min(c[t] for c in curves) for t in range(steps + 1)],
            "curve_max": [max(c[t] for c in curves) for t in range(steps + 1)]}


def tune(act: str, kind: str, steps: int, grid: tuple[float, ...], bar: tqdm, **kw) -> tuple[float, dict, list]:
    """A tuned arm (symo_defaults, symo_published): seed-0 test loss after `steps` updates on `grid`, extended
    while the best is at an edge -> (best lr, {lr: final test loss}, the best rate's seed-0 curve)."""
    tried: dict[float, list[float]] = {}
    pending = list(grid)
    for _ in range(4):
        for lr in pending:
            tried[lr] = run(act, kind, 0, steps, lr=lr, **kw)
            bar.update(1)
        lrs = sorted(tried)
        best = min(lrs, key=lambda v: tried[v][-1])
        pending = [best / 3] if best == lrs[0] else [best * 3] if best == lrs[-1] else []
        if not pending:
            break
        bar.total += 1
    return best, {f"{lr:g}": tried[lr][-1] for lr in sorted(tried)}, tried[best]


def benchmark(acts: tuple[str, ...] = ("tanh", "linear"), seeds: int = 3, steps: int = 100,
              grids: dict[str, tuple[float, ...]] = TUNED, checkpoints: tuple[int, ...] = CHECKPOINTS, **kw) -> dict:
    """Every optimizer on every activation: {act: {optimizer: {"lr", "test_loss_mean", ...}}}; `kw`
    (sizes, n_train, n_test) go to `run`."""
    kinds = [k for k in OPTIMIZERS + EXTRA if k not in grids]
    bar = tqdm(total=len(acts) * (len(kinds) * seeds + sum(len(g) + seeds - 1 for g in grids.values())),
               desc="paper_mlp")
    out: dict = {}
    for act in acts:
        cfg, res = SETTINGS[act], {}
        for kind in kinds:
            bar.set_postfix_str(f"{act} {kind}")
            curves = []
            for s in range(seeds):
                curves.append(run(act, kind, s, steps, **kw))
                bar.update(1)
            base = kind.split("_")[0]
            res[kind] = {"lr": dict(cfg["symo"]) if base == "symo" else cfg[base],
                         **summarise(curves, checkpoints)}
            if base == "shampoo":
                res[kind]["eps"] = cfg["shampoo_eps"]
            if base == "kfac":
                res[kind]["damping"] = cfg["kfac_damping"]
        for kind, grid in grids.items():
            bar.set_postfix_str(f"{act} {kind}")
            best, tried, curve0 = tune(act, kind, steps, grid, bar, **kw)
            curves = [curve0]
            for s in range(1, seeds):
                curves.append(run(act, kind, s, steps, lr=best, **kw))
                bar.update(1)
            res[kind] = {"lr": best, "grid": tried, **summarise(curves, checkpoints)}
        out[act] = res
    bar.close()
    return out


# ------------------------------------------------------------------ output
LABELS = {"symo": "Symo, preset notebook", "gd": "GD", "adam": "Adam", "shampoo": "Shampoo (two-sided)",
          "kfac": "K-FAC", "symo_float64": "Symo, preset notebook, float64", "symo_stats_float32":
          "Symo, preset notebook, stats_dtype float32", "kfac_per_point":
          "K-FAC, per-point G (same rate, damping)", "symo_defaults": "Symo, no preset (defaults), constant lr",
          "symo_published": "Symo, preset published, constant lr"}


def _lr_text(entry: dict) -> str:
    lr = entry["lr"]
    text = f"{lr['alpha']:g} x {lr['beta']:g}^t" if isinstance(lr, dict) else f"{lr:g}"
    if "eps" in entry:
        text += f", eps {entry['eps']:g}"
    if "damping" in entry:
        text += f", damping {entry['damping']:g}"
    return text


def target_check(results: dict) -> list[tuple[str, int, float, float, bool]]:
    """(activation, update, target, Symo's seed-mean test loss, met) for each activation run."""
    rows = []
    for act, (t, target) in TARGETS.items():
        if act in results and str(t) in results[act]["symo"]["test_loss_mean"]:
            value = results[act]["symo"]["test_loss_mean"][str(t)]
            rows.append((act, t, target, value, value <= target))
    return rows


def write(results: dict, linear_fit: dict[str, list[float]], meta: dict, out: Path) -> None:
    """benchmarks/results/paper_mlp.{json,md,png}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = ["# The paper's teacher-student experiment: 100-70-40 MLP, float32", "",
             f"Command: `{meta['command']}` ({meta['wall_s']:.0f} s, one torch thread, 2 shared CPU cores).", "",
             "Bias-free 100-70-40 MLP (tanh or identity), student and teacher weights N(0, 1/fan_in) (separate "
             "draws, teacher unscaled); inputs N(0, Q diag(logspace(0, -5, 100)) Q^T), Q a random orthogonal "
             "matrix; 5000 train and 5000 test points, targets teacher(x), no noise; loss ||out - y||^2 / N / 2; "
             f"full batch; {meta['steps']} updates; {meta['seeds']} seeds. Every optimizer at the paper's setting "
             "(no tuning), except the two rows with a constant learning rate tuned here (seed 0, test loss after "
             f"{meta['steps']} updates, a 4-point factor-3 grid extended while the best rate sits at its edge, "
             "then the other seeds at the chosen rate): `symo_defaults` (no preset) and `symo_published` (the "
             "published step, `preset=\"published\"`, which the paper's figure does not have a setting for; its "
             "grid starts around the preset's recommended rate). Model and data in float32 unless the row says "
             "float64. Symo's spec: one signed_perm "
             "hidden space (fc1 rows, fc2 columns), for both activations. Entries: test loss after that many "
             "updates, mean ± std (population) over seeds.", "",
             "Shampoo and K-FAC are written in the script. Shampoo's -1/4 powers come from a float64 SVD of the "
             "float32 sums (|eigenvalue|^p with the eigenvalue's sign, so a sum rounded below zero stays finite). "
             "K-FAC's G is the second moment of the mean loss's pre-activation gradients, the scale the paper's "
             "rate and damping were chosen for; `kfac_per_point` builds G from N times those gradients (the "
             "per-point curvature) at the same rate and damping. `symo_stats_float32` is the notebook preset with "
             "`stats_dtype=\"float32\"`.", "", "## Targets (float32, from the paper's figure)", "",
             "| activation | Symo (preset notebook) | target | measured | |", "|---|---|---:|---:|---|"]
    for act, t, target, value, ok in target_check(results):
        lines.append(f"| {act} | test loss after {t} updates | <= {target:.1e} | {value:.3e} | "
                     f"{'pass' if ok else 'FAIL'} |")
    for act, res in results.items():
        points = list(res["symo"]["test_loss_mean"])
        lines += ["", f"## {act}", "", "| optimizer | lr | " + " | ".join(f"after {t}" for t in points) + " |",
                  "|---|---|" + "---:|" * len(points)]
        for kind, e in res.items():
            cells = [f"{e['test_loss_mean'][t]:.3e} ± {e['test_loss_std'][t]:.1e}" for t in points]
            lines.append(f"| {LABELS.get(kind, kind)} (`{kind}`) | {_lr_text(e)} | " + " | ".join(cells) + " |")
        fit = linear_fit[act]
        lines += ["", f"Best linear map x -> W x (least squares on the training set, float64): test loss "
                  f"{statistics.fmean(fit):.3e} (seeds: {', '.join(f'{v:.3e}' for v in fit)}). "
                  + ("This is not a floor: the student has the teacher's architecture, so test loss 0 is "
                     "attainable; it is the level of a purely linear model, and a curve below it has fitted "
                     "part of the teacher's nonlinearity." if act == "tanh" else
                     "The teacher is linear, so the best linear map is exact (0 up to rounding) and so is the floor."),
                  ""] + [f"`{kind}` learning-rate grid (seed 0, test loss after {meta['steps']} updates): "
                         + ", ".join(f"{lr}: {v:.3g}" for lr, v in e["grid"].items()) + "."
                         for kind, e in res.items() if "grid" in e]
    write_results(out, "paper_mlp", "\n".join(lines), results)

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (act, res) in zip(axes[0], results.items()):
        for kind, e in res.items():
            xs = range(len(e["curve_mean"]))
            style = {"lw": 2.2} if kind == "symo" else {"lw": 1.1, "ls": "--" if kind in EXTRA else "-"}
            (line,) = ax.plot(xs, e["curve_mean"], label=f"{kind} ({_lr_text(e)})", **style)
            ax.fill_between(xs, e["curve_min"], e["curve_max"], color=line.get_color(), alpha=0.15, lw=0)
        if statistics.fmean(linear_fit[act]) > 1e-12:  # the linear teacher's is 0 up to rounding: not drawn
            ax.axhline(statistics.fmean(linear_fit[act]), color="gray", ls=":", lw=1, label="best linear map")
        t, target = TARGETS[act]
        ax.plot([t], [target], marker="v", color="k", ls="none", label=f"target (Symo, {t} updates)")
        ax.set_yscale("log")
        ax.set_xlabel("update")
        ax.set_ylabel("test loss (mean over seeds; band: min-max)")
        ax.set_title(f"{act}: 100-70-40 MLP, float32")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5)
    fig.tight_layout()
    fig.savefig(out / "paper_mlp.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--activation", choices=["tanh", "linear", "both"], default="both")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    acts = ("tanh", "linear") if args.activation == "both" else (args.activation,)
    cmd = "python -m benchmarks.paper_mlp" + "".join(
        f" --{k} {v}" for k, v, d in (("seeds", args.seeds, 3), ("steps", args.steps, 100),
                                      ("activation", args.activation, "both")) if v != d)
    t0 = time.time()
    results = benchmark(acts, args.seeds, args.steps)
    linear_fit = {act: [linear_fit_test_loss(act, s) for s in range(args.seeds)] for act in acts}
    write(results, linear_fit, {"command": cmd, "wall_s": time.time() - t0, "steps": args.steps,
                                "seeds": args.seeds}, Path(args.out))
    print((Path(args.out) / "paper_mlp.md").read_text())
    failed = [r for r in target_check(results) if not r[4]]
    if failed:
        print("targets missed: " + "; ".join(f"{a} after {t}: {v:.3e} > {g:.1e}" for a, t, g, v, _ in failed))


if __name__ == "__main__":
    main()
