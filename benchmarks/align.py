"""Aligning and merging two independently trained models modulo their symmetry: loss barriers along the
straight path between them, naive against aligned (symo.align), and the time to align.

1. `mnist_mlp`: Git Re-Basin's MNIST MLP (784-512-512-512-10, ReLU), two seeds trained with Adam. Test
   loss and accuracy along the path: naive, weight matching, activation matching (spec inferred), weight
   matching + REPAIR, and the `rebasin` package (PyPI 0.0.47) on the same pair where it imports.
2. `fashion_rescnn`: a CPU-sized residual CNN with BatchNorm on Fashion-MNIST (Debian's
   dataset-fashion-mnist files; MNIST when they are missing, which the md then says): naive, naive with
   BatchNorm statistics reset, weight matching (statistics as interpolated), + reset, + REPAIR.
3. `gpt`: two `symo train` GPTs (4 x 128, 4 heads; seeds 0 and 1; Shakespeare): naive, heads and MLP
   units (specs/gpt_true.toml: per-head O(d_head) Procrustes, MLP permutations), + the residual stream
   (the inferred spec: a residual permutation), activation matching; validation loss of the midpoint
   against both parents.
4. `gpt2_speed`: align time at GPT-2 small widths (d_model 768, 12 heads, vocabulary 50304; random
   weights) against the number of layers, hence of spaces.

Trained models are cached in benchmarks/results/align_cache/ (not committed), so a rerun only aligns.

    python -m benchmarks.align              # everything (about 10 minutes on one thread the first time)
    python -m benchmarks.align --quick      # a smoke run: tiny training, two speed points
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import symo
from symo.align import BarrierResult, barrier
from symo.train import TrainConfig, train
from symo.train.data import load_corpus
from symo.train.data_mnist import load_mnist
from symo.train.models import GPT, MLP, GPTConfig

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = RESULTS / "align_cache"
FASHION = Path("/usr/share/datasets/fashion-mnist")
ALPHAS = 11


# ---------------------------------------------------------------- data and models
def load_fashion() -> tuple[torch.Tensor, ...] | None:
    """Fashion-MNIST from the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist)."""
    files = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
             "t10k-labels-idx1-ubyte.gz"]
    if not all((FASHION / f).is_file() for f in files):
        return None
    out = []
    for f in files:
        raw = np.frombuffer(gzip.open(FASHION / f).read(), dtype=np.uint8)
        images = "images" in f
        data = raw[16:].reshape(-1, 784).astype(np.float32) / 255 if images else raw[8:].astype(np.int64)
        out.append(torch.from_numpy(data.copy()))
    return tuple(out)


class ResCNN(nn.Module):
    """conv(stride 2) -> BN -> ReLU, a residual block at width w (14 x 14), a downsampling residual block
    at 2w (7 x 7) with a 1x1 shortcut, average pool, linear: ResNet's structure at CPU size."""

    def __init__(self, w: int = 16, classes: int = 10) -> None:
        super().__init__()
        conv = lambda a, b, s=1: nn.Conv2d(a, b, 3, stride=s, padding=1, bias=False)  # noqa: E731
        self.conv1, self.bn1 = conv(1, w, 2), nn.BatchNorm2d(w)
        self.b1c1, self.b1n1, self.b1c2, self.b1n2 = conv(w, w), nn.BatchNorm2d(w), conv(w, w), nn.BatchNorm2d(w)
        self.b2c1, self.b2n1 = conv(w, 2 * w, 2), nn.BatchNorm2d(2 * w)
        self.b2c2, self.b2n2 = conv(2 * w, 2 * w), nn.BatchNorm2d(2 * w)
        self.short, self.shortn = nn.Conv2d(w, 2 * w, 1, stride=2, bias=False), nn.BatchNorm2d(2 * w)
        self.fc = nn.Linear(2 * w, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x.view(-1, 1, 28, 28))))
        x = F.relu(x + self.b1n2(self.b1c2(F.relu(self.b1n1(self.b1c1(x))))))
        x = F.relu(self.shortn(self.short(x)) + self.b2n2(self.b2c2(F.relu(self.b2n1(self.b2c1(x))))))
        return self.fc(x.mean((2, 3)))

    def example_inputs(self) -> tuple[torch.Tensor]:
        return (torch.randn(4, 784, generator=torch.Generator().manual_seed(0)),)


def train_classifier(make, x: torch.Tensor, y: torch.Tensor, seed: int, epochs: int, batch: int, lr: float,
                     path: Path) -> nn.Module:
    """Adam, shuffled minibatches (seeded); cached at `path`."""
    torch.manual_seed(seed)
    model = make()
    if path.is_file():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(batch):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model.eval()


def classify(model: nn.Module, batch) -> dict[str, torch.Tensor]:
    logits = model(batch[0])
    return {"loss": F.cross_entropy(logits, batch[1]), "acc": (logits.argmax(-1) == batch[1]).double().mean()}


def row(path: BarrierResult, seconds: float | None, acc: bool = True) -> dict:
    return {"barrier_loss": path.barrier("loss"), "barrier_acc": path.barrier("acc") if acc else None,
            "midpoint_loss": path.midpoint("loss"), "align_seconds": seconds,
            "midpoint_acc": path.midpoint("acc") if acc else None,
            "end_losses": [path.values["loss"][0], path.values["loss"][-1]], "alphas": path.alphas,
            "losses": path.values["loss"], "accs": path.values.get("acc")}


def timed_align(a, b, **kw):
    t0 = time.perf_counter()
    result = symo.align(a, b, **kw)
    return result, time.perf_counter() - t0


# ---------------------------------------------------------------- the cases
def case_mnist(quick: bool) -> tuple[dict, str]:
    x, y, xt, yt = load_mnist()
    epochs = 1 if quick else 5
    make = lambda: MLP((784, 512, 512, 512, 10), act="relu")  # noqa: E731
    a, b = (train_classifier(make, x, y, s, epochs, 512, 1e-3, CACHE / f"mnist_mlp_e{epochs}_s{s}.pt") for s in (0, 1))
    test = [(xt[i:i + 2000], yt[i:i + 2000]) for i in range(0, 10000, 2000)]
    fit = [x[i:i + 1000] for i in range(0, 5000, 1000)]  # activation statistics and REPAIR's: training images
    out = {"naive": row(barrier(a, b, classify, test, ALPHAS), 0.0)}
    w, tw = timed_align(a, b)
    out["weights"] = row(barrier(a, w.model, classify, test, ALPHAS), tw)
    act, ta = timed_align(a, b, method="activations", data=fit)
    out["activations"] = row(barrier(a, act.model, classify, test, ALPHAS), ta)
    out["weights+repair"] = row(barrier(a, w.model, classify, test, ALPHAS, repair_data=fit, repair_mode="repair"), tw)
    note = rebasin_row(a, b, x[:1000], test, out)
    return out, f"{epochs} epochs of Adam (lr 1e-3, batch 512) per model; spec inferred: {_spaces(w)}. {note}"


def rebasin_row(a: nn.Module, b: nn.Module, inputs: torch.Tensor, test, out: dict) -> str:
    """The `rebasin` package's weight matching on the same pair, where it imports."""
    try:
        import rebasin  # optional, not a dependency: pip install --no-deps rebasin torchview graphviz
    except Exception as exc:  # noqa: BLE001  (absent, or its own imports fail)
        return f"rebasin: not available ({type(exc).__name__}: {exc})."
    moved = copy.deepcopy(b)
    t0 = time.perf_counter()
    try:
        rebasin.PermutationCoordinateDescent(a, moved, inputs).rebasin()
    except Exception as exc:  # noqa: BLE001  (its tracer refuses a model: report it)
        return f"rebasin: failed on this model ({type(exc).__name__}: {str(exc)[:200]})."
    seconds = time.perf_counter() - t0
    out["rebasin (PyPI 0.0.47)"] = row(barrier(a, moved, classify, test, ALPHAS), seconds)
    return "rebasin 0.0.47 (its PermutationCoordinateDescent, installed with --no-deps beside torchview) ran."


def case_fashion(quick: bool) -> tuple[dict, str]:
    data = load_fashion()
    source = "Fashion-MNIST (Debian's dataset-fashion-mnist)"
    if data is None:
        data = load_mnist()
        source = "MNIST (Fashion-MNIST not installed: apt-get install dataset-fashion-mnist)"
    x, y, xt, yt = data
    epochs = 1 if quick else 2
    tag = "fashion" if "Fashion" in source else "mnist"
    a, b = (train_classifier(ResCNN, x, y, s, epochs, 128, 2e-3, CACHE / f"{tag}_rescnn_e{epochs}_s{s}.pt")
            for s in (0, 1))
    test = [(xt[i:i + 2500], yt[i:i + 2500]) for i in range(0, 5000, 2500)]  # half the test set: 55 evaluations
    fit = [x[i:i + 500] for i in range(0, 2000, 500)]
    out = {"naive": row(barrier(a, b, classify, test, ALPHAS), 0.0),
           "naive+reset": row(barrier(a, b, classify, test, ALPHAS, repair_data=fit, repair_mode="reset"), 0.0)}
    w, tw = timed_align(a, b)
    out["weights"] = row(barrier(a, w.model, classify, test, ALPHAS), tw)
    out["weights+reset"] = row(barrier(a, w.model, classify, test, ALPHAS, repair_data=fit, repair_mode="reset"), tw)
    out["weights+repair"] = row(barrier(a, w.model, classify, test, ALPHAS, repair_data=fit, repair_mode="repair"),
                                tw)
    return out, (f"{source}; test loss on the first 5,000 test images, statistics (reset, REPAIR) on 2,000 training "
                 f"images; ResCNN width 16/32 ({sum(p.numel() for p in a.parameters()):,} parameters), {epochs} "
                 f"epochs of Adam (lr 2e-3, batch 128) per model; spec inferred: {_spaces(w)}")


def case_gpt(quick: bool) -> tuple[dict, str]:
    steps = 60 if quick else 500
    models = []
    for seed in (0, 1):
        run = CACHE / f"gpt_{steps}_s{seed}"
        cfg = TrainConfig(steps=steps, seed=seed, out_dir=str(run), threads=1, progress=False, sample_chars=0,
                          resume=(run / "ckpt.pt").is_file())
        if not (run / "ckpt.pt").is_file() or torch.load(run / "ckpt.pt", weights_only=True)["step"] < steps:
            train(cfg)
        blob = torch.load(run / "ckpt.pt", weights_only=True)
        o = blob["options"]
        model = GPT(GPTConfig(block_size=o["block_size"], vocab_size=len(blob["settings"]["vocab"]),
                              n_layer=o["n_layer"], n_head=o["n_head"], n_embd=o["n_embd"], bias=o["bias"]))
        model.load_state_dict(blob["model"])
        models.append(model.eval())
    a, b = models
    corpus = load_corpus(None)
    val = [corpus.batch("val", k, 16, 64, 0) for k in range(16)]
    fit = [corpus.batch("train", k, 16, 64, 123)[0] for k in range(8)]

    def lm(model, batch):
        logits, loss = model(*batch)
        return {"loss": loss, "acc": (logits.argmax(-1) == batch[1]).double().mean()}

    d_head = a.config.n_embd // a.config.n_head
    out = {"naive": row(barrier(a, b, lm, val, ALPHAS), 0.0)}
    heads, th = timed_align(a, b, spec="gpt_true", sizes={"dqk{i}": d_head, "dvo{i}": d_head})
    out["weights: heads + MLP (gpt_true)"] = row(barrier(a, heads.model, lm, val, ALPHAS), th)
    full, tf = timed_align(a, b)
    out["weights: + residual (inferred)"] = row(barrier(a, full.model, lm, val, ALPHAS), tf)
    act, ta = timed_align(a, b, method="activations", data=fit)
    out["activations (inferred)"] = row(barrier(a, act.model, lm, val, ALPHAS), ta)
    cos = {s.name: (round(s.before, 3), round(s.after, 3)) for s in full.spaces}
    return out, (f"two `symo train` runs ({steps} steps, batch 16 x 64, Symo defaults, seeds 0 and 1), "
                 f"{sum(p.numel() for p in a.parameters()):,} parameters; validation: 16 batches of 16 x 64; "
                 f"cosine <W_a, g W_b>/(|W_a||W_b|) per space before -> after (inferred spec): {cos}")


def case_speed(quick: bool) -> tuple[dict, str]:
    layers = (1, 2) if quick else (1, 3, 6, 12)
    out = {}
    spec = None
    for n_layer in layers:
        cfg = GPTConfig(block_size=1024, vocab_size=50304, n_layer=n_layer, n_head=12, n_embd=768)
        torch.manual_seed(0)
        a = GPT(cfg)
        torch.manual_seed(1)
        b = GPT(cfg)
        # inferred once on a 2-layer model: its {i} rules cover every depth
        spec = spec or symo.infer_spec(GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=12, n_embd=768)))
        result, seconds = timed_align(a, b, spec=spec, check=False, max_sweeps=3)
        out[f"{n_layer} layers"] = {"barrier_loss": None, "barrier_acc": None, "midpoint_loss": None,
                                    "align_seconds": seconds, "spaces": len(result.spaces),
                                    "params": sum(p.numel() for p in a.parameters()), "sweeps": result.sweeps,
                                    "match_seconds": result.seconds["match"], "start": result.start}
        del a, b, result
    return out, ("GPT-2 small widths (d_model 768, 12 heads of 64, MLP 3072, vocabulary 50304, context 1024), "
                 "random weights, float32; spec inferred once (residual perm, per-head O(64), MLP perm per layer); "
                 "at most 3 sweeps per start (random weights never converge to a clean optimum), both starts "
                 "(identity and solo)")


def _spaces(result) -> str:
    groups: dict[str, int] = {}
    for s in result.spaces:
        key = s.group + (" per head" if s.per else "")
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(f"{n} {g}" for g, n in groups.items())


# ---------------------------------------------------------------- output
def write(results: dict, notes: dict, argv: str, seconds: float) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "align.json").write_text(json.dumps(results, indent=1))
    lines = ["# Aligning and merging models modulo their symmetry", "", f"Command: `{argv}`", "",
             f"torch {torch.__version__}, {platform.machine()}, one torch thread, shared 2-core machine; "
             f"{seconds / 60:.1f} min in all (cached models are reused).", "",
             "Barrier = the largest rise of the loss above the straight line between the end points' losses along "
             "(1 - alpha) A + alpha B (11 points; for accuracy the largest drop below its line). Midpoint = alpha "
             "0.5.", ""]
    titles = {"mnist_mlp": "MNIST MLP (3 x 512 ReLU), test set",
              "fashion_rescnn": "Residual CNN with BatchNorm, test set", "gpt": "Character GPT 4 x 128, validation",
              "gpt2_speed": "Align time at GPT-2 small widths"}
    for case, rows in results.items():
        lines += [f"## {titles[case]}", "", notes[case], ""]
        if case == "gpt2_speed":
            lines += ["| layers | parameters | spaces | sweeps | align seconds | matching seconds | best start |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {k} | {r['params']:,} | {r['spaces']} | {r['sweeps']} | {r['align_seconds']:.1f} | "
                      f"{r['match_seconds']:.1f} | {r['start']} |" for k, r in rows.items()]
        else:
            ends = rows["naive"]["end_losses"]
            lines += [f"End points: loss {ends[0]:.4f} (A), {ends[1]:.4f} (B).", "",
                      "| method | loss barrier | accuracy barrier | midpoint loss | midpoint accuracy | align s |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {m} | {r['barrier_loss']:.4f} | {100 * r['barrier_acc']:.2f}% | {r['midpoint_loss']:.4f} | "
                      f"{100 * r['midpoint_acc']:.2f}% | {r['align_seconds']:.2f} |" for m, r in rows.items()]
        lines.append("")
    (RESULTS / "align.md").write_text("\n".join(lines))
    plot(results)


def plot(results: dict) -> None:
    try:
        import matplotlib  # optional (the bench extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # (the same optional dependency)
    except ImportError:
        return
    cases = [c for c in ("mnist_mlp", "fashion_rescnn", "gpt") if c in results]
    fig, axes = plt.subplots(1, len(cases) + ("gpt2_speed" in results), figsize=(4.2 * (len(cases) + 1), 3.4))
    axes = np.atleast_1d(axes)
    for ax, case in zip(axes, cases):
        for method, r in results[case].items():
            ax.plot(r["alphas"], r["losses"], marker="o", ms=3, label=method)
        ax.set_title(case)
        ax.set_xlabel("alpha (0: A, 1: B aligned)")
        ax.set_ylabel("loss")
        ax.legend(fontsize=7)
    if "gpt2_speed" in results:
        rows = list(results["gpt2_speed"].values())
        axes[-1].plot([r["spaces"] for r in rows], [r["align_seconds"] for r in rows], marker="o")
        axes[-1].set_xlabel("spaces (GPT-2 small widths)")
        axes[-1].set_ylabel("align seconds")
        axes[-1].set_title("gpt2_speed")
    fig.tight_layout()
    fig.savefig(RESULTS / "align.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny training, two speed points")
    parser.add_argument("--cases", nargs="+", default=["mnist_mlp", "fashion_rescnn", "gpt", "gpt2_speed"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    runners = {"mnist_mlp": case_mnist, "fashion_rescnn": case_fashion, "gpt": case_gpt, "gpt2_speed": case_speed}
    results, notes = {}, {}
    for case in args.cases:
        t1 = time.perf_counter()
        results[case], notes[case] = runners[case](args.quick)
        print(f"{case}: {time.perf_counter() - t1:.0f} s", flush=True)
    command = "python -m benchmarks.align" + (" --quick" if args.quick else "") + (
        f" --cases {' '.join(args.cases)}" if argv and "--cases" in argv else "")
    write(results, notes, command, time.perf_counter() - t0)
    print((RESULTS / "align.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
