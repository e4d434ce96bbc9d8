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
   against both parents. `gpt_adamw`: the same with two AdamW runs, to tell the optimizer's part apart.
   Diagnostics per case: each space's weight cosine before and after, how far training moved the weights
   from their init, the mean activation correlation of the units weight and activation matching pair,
   and (GPT) what a head permutation, which no spec can declare, would add.
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
from symo.alignment import BarrierResult, barrier
from symo.train import TrainConfig, train
from symo.train.data import load_corpus
from symo.train.data_mnist import load_mnist
from symo.train.models import GPT, MLP, GPTConfig

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = RESULTS / "align_cache"
FASHION = Path("/usr/share/datasets/fashion-mnist")
ALPHAS = 11
CASES = ["mnist_mlp", "fashion_rescnn", "gpt", "gpt_adamw", "gpt2_speed"]


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


def drift(model: nn.Module, init: nn.Module) -> float:
    """|W - W_init| / |W_init| over the weight matrices: how far training moved them from the random init."""
    pairs = [(p, q) for p, q in zip(model.parameters(), init.parameters()) if p.dim() >= 2]
    moved = sum(float((p.detach() - q.detach()).double().pow(2).sum()) for p, q in pairs)
    return (moved / sum(float(q.detach().double().pow(2).sum()) for _, q in pairs)) ** 0.5


def head_assignment(a: GPT, b: GPT) -> tuple[int, float]:
    """With b aligned to a: per layer, the Procrustes optimum of every (head of a, head of b) pair, summed
    over the query/key and value/output gauges; returns how many heads a head permutation would reassign
    (linear assignment on those optima) and the relative gain of the attention part of the objective.
    Spec head owners are identity spaces, so `symo.align` keeps heads in place."""
    from scipy.optimize import linear_sum_assignment  # scipy: a dependency of symo; only this diagnostic

    moved, diagonal, best = 0, 0.0, 0.0
    c, h = a.config.n_embd, a.config.n_head
    d = c // h
    for la, lb in zip(a.transformer.h, b.transformer.h):
        wa, wb = la.attn.c_attn.weight.detach().double(), lb.attn.c_attn.weight.detach().double()
        pa, pb = la.attn.c_proj.weight.detach().double(), lb.attn.c_proj.weight.detach().double()
        m = torch.zeros(h, h, dtype=torch.float64)
        for i in range(h):
            for j in range(h):
                rows_i, rows_j = slice(i * d, (i + 1) * d), slice(j * d, (j + 1) * d)
                qk = wa[rows_i] @ wb[rows_j].T + wa[c:][rows_i] @ wb[c:][rows_j].T
                vo = wa[2 * c:][rows_i] @ wb[2 * c:][rows_j].T + pa[:, rows_i].T @ pb[:, rows_j]
                m[i, j] = torch.linalg.matrix_norm(qk, "nuc") + torch.linalg.matrix_norm(vo, "nuc")
        rows, cols = linear_sum_assignment(m.numpy(), maximize=True)
        moved += int((rows != cols).sum())
        diagonal += float(m.diagonal().sum())
        best += float(m[rows, cols].sum())
    return moved, best / diagonal - 1


def matched_correlation(a: nn.Module, b: nn.Module, result, data: list, units: dict[str, str]) -> float:
    """Mean over the perm spaces in `units` (space -> the Linear whose input holds its units) of the correlation
    between a's unit i and the unit of b that `result` pairs with it, on `data`."""
    values = []
    for space, name in units.items():
        if space not in result.elements:
            continue
        feats = []
        for model in (a, b):
            got: list[torch.Tensor] = []
            handle = dict(model.named_modules())[name].register_forward_hook(
                lambda m, args, out, got=got: got.append(args[0]))
            with torch.no_grad():
                for batch in data:
                    model(batch)
            handle.remove()
            z = torch.cat([g.reshape(-1, g.shape[-1]) for g in got]).double()
            feats.append((z - z.mean(0)) / (z.std(0) + 1e-12))
        values.append(float((feats[0] * feats[1][:, result.elements[space]]).mean(0).mean()))
    return sum(values) / len(values)


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
    inits = [_init(make, s) for s in (0, 1)]
    units = {"fc1": "fc2", "fc2": "fc3", "fc3": "fc4"}
    corr = {m: matched_correlation(a, b, r, fit, units) for m, r in (("weights", w), ("activations", act))}
    return out, (f"{epochs} epochs of Adam (lr 1e-3, batch 512) per model; spec inferred: {_spaces(w)}. {note} "
                 f"Diagnostics: {_cosines(w)}; training moved the weight matrices by {drift(a, inits[0]):.2f} and "
                 f"{drift(b, inits[1]):.2f} of their init's norm; mean activation correlation of the hidden units "
                 f"each method pairs: weights {corr['weights']:.2f}, activations {corr['activations']:.2f}")


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
    act, ta = timed_align(a, b, method="activations", data=fit)
    out["activations+reset"] = row(barrier(a, act.model, classify, test, ALPHAS, repair_data=fit,
                                           repair_mode="reset"), ta)
    inits = [_init(ResCNN, s) for s in (0, 1)]
    return out, (f"{source}; test loss on the first 5,000 test images, statistics (reset, REPAIR) on 2,000 "
                 f"training images; ResCNN width 16/32 ({sum(p.numel() for p in a.parameters()):,} parameters), "
                 f"{epochs} epochs of Adam (lr 2e-3, batch 128) per model; spec inferred: {_spaces(w)}. "
                 f"Diagnostics: {_cosines(w)}; training moved the weights by {drift(a, inits[0]):.2f} and "
                 f"{drift(b, inits[1]):.2f} of their init's norm")


def case_gpt(quick: bool, optimizer: str = "symo") -> tuple[dict, str]:
    steps = 60 if quick else 500
    models, inits = [], []
    for seed in (0, 1):
        run = CACHE / (f"gpt_{steps}_s{seed}" if optimizer == "symo" else f"gpt_{optimizer}_{steps}_s{seed}")
        cfg = TrainConfig(steps=steps, seed=seed, out_dir=str(run), threads=1, progress=False, sample_chars=0,
                          optimizer=optimizer, resume=(run / "ckpt.pt").is_file())
        if not (run / "ckpt.pt").is_file() or torch.load(run / "ckpt.pt", weights_only=True)["step"] < steps:
            train(cfg)
        blob = torch.load(run / "ckpt.pt", weights_only=True)
        o = blob["options"]
        model = GPT(GPTConfig(block_size=o["block_size"], vocab_size=len(blob["settings"]["vocab"]),
                              n_layer=o["n_layer"], n_head=o["n_head"], n_embd=o["n_embd"], bias=o["bias"]))
        model.load_state_dict(blob["model"])
        models.append(model.eval())
        torch.manual_seed(seed)  # symo train's init: the seed, then the model
        inits.append(GPT(model.config))
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
    moved, gain = head_assignment(a, full.model)
    units = {f"c_fc{i}": f"transformer.h.{i}.mlp.c_proj" for i in range(a.config.n_layer)}
    corr = {m: matched_correlation(a, b, r, fit, units) for m, r in (("weights", full), ("activations", act))}
    label = {"symo": "Symo defaults (Muon's step, gpt_muon)", "adamw": "AdamW"}[optimizer]
    return out, (f"two `symo train` runs ({steps} steps, batch 16 x 64, {label}, seeds 0 and 1), "
                 f"{sum(p.numel() for p in a.parameters()):,} parameters; validation: 16 batches of 16 x 64. "
                 f"Diagnostics: {_cosines(full)}; training moved the weight matrices by "
                 f"{drift(a, inits[0]):.2f} and {drift(b, inits[1]):.2f} of their init's norm; a head permutation "
                 f"(not in the group: head owners are identity spaces) would reassign {moved} of "
                 f"{a.config.n_layer * a.config.n_head} heads and raise the attention part of the objective by "
                 f"{100 * gain:.1f}%; mean activation correlation of the MLP units each method pairs: "
                 f"weights {corr['weights']:.2f}, activations {corr['activations']:.2f}")


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


def _init(make, seed: int) -> nn.Module:
    torch.manual_seed(seed)  # train_classifier's init: the seed, then the model
    return make()


def _cosines(result) -> str:
    """Each space's cosine <W_a, g W_b> / (|W_a| |W_b|) over its parameters, at the identity -> after."""
    return "cosine per space before -> after weight matching: " + ", ".join(
        f"{s.name} {s.before:.2f} -> {s.after:.2f}" for s in result.spaces)


def _spaces(result) -> str:
    groups: dict[str, int] = {}
    for s in result.spaces:
        key = s.group + (" per head" if s.per else "")
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(f"{n} {g}" for g, n in groups.items())


# ---------------------------------------------------------------- output
def write(results: dict, notes: dict, argv: str, seconds: float) -> None:
    """align.{json,md,png}; cases not run this time keep their previous rows and notes."""
    RESULTS.mkdir(exist_ok=True)
    old = RESULTS / "align.json"
    old_notes = CACHE / "notes.json"
    if old.is_file():
        results = {**json.loads(old.read_text()), **results}
    if old_notes.is_file():
        notes = {**json.loads(old_notes.read_text()), **notes}
    CACHE.mkdir(parents=True, exist_ok=True)
    old_notes.write_text(json.dumps(notes))
    results = {c: results[c] for c in CASES if c in results}
    (RESULTS / "align.json").write_text(json.dumps(results, indent=1))
    lines = ["# Aligning and merging models modulo their symmetry", "", f"Command: `{argv}`", "",
             f"torch {torch.__version__}, {platform.machine()}, one torch thread, shared 2-core machine; "
             f"{seconds / 60:.1f} min in all (trained models are cached in benchmarks/results/align_cache and "
             "reused).", "",
             "Barrier = the largest rise of the loss above the straight line between the end points' losses along "
             "(1 - alpha) A + alpha B (11 points; for accuracy the largest drop below its line). Midpoint = alpha "
             "0.5.", ""]
    titles = {"mnist_mlp": "MNIST MLP (3 x 512 ReLU), test set",
              "fashion_rescnn": "Residual CNN with BatchNorm, test set",
              "gpt": "Character GPT 4 x 128 trained with Symo, validation",
              "gpt_adamw": "Character GPT 4 x 128 trained with AdamW, validation",
              "gpt2_speed": "Align time at GPT-2 small widths"}
    for case, rows in results.items():
        lines += [f"## {titles[case]}", "", notes.get(case, "(notes: see the run that wrote these rows)"), ""]
        if case == "gpt2_speed":
            lines += ["| layers | parameters | spaces | sweeps | align seconds | matching seconds | best start |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {k.split()[0]} | {r['params']:,} | {r['spaces']} | {r['sweeps']} | "
                      f"{r['align_seconds']:.1f} | {r['match_seconds']:.1f} | {r['start']} |" for k, r in rows.items()]
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
    cases = [c for c in ("mnist_mlp", "fashion_rescnn", "gpt", "gpt_adamw") if c in results]
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
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    runners = {"mnist_mlp": case_mnist, "fashion_rescnn": case_fashion, "gpt": case_gpt,
               "gpt_adamw": lambda quick: case_gpt(quick, "adamw"), "gpt2_speed": case_speed}
    results, notes = {}, {}
    command = "python -m benchmarks.align" + (" --quick" if args.quick else "") + (
        f" --cases {' '.join(args.cases)}" if args.cases != CASES else "")
    for case in args.cases:
        t1 = time.perf_counter()
        results[case], note = runners[case](args.quick)
        seconds = time.perf_counter() - t1
        notes[case] = f"Rows written by `{command}` ({seconds:.0f} s). {note}"
        print(f"{case}: {seconds:.0f} s", flush=True)
    write(results, notes, command, time.perf_counter() - t0)
    print((RESULTS / "align.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
