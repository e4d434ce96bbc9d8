"""Aligning and merging two independently trained models modulo their symmetry: loss barriers along the
straight path between them, naive against aligned (symo.align), and the time to align.

1. `mnist_mlp`: Git Re-Basin's MNIST MLP (784-512-512-512-10, ReLU), two seeds trained with Adam. Test
   loss and accuracy along the path: naive, weight matching, activation matching (spec inferred), weight
   matching + REPAIR, and the `rebasin` package (PyPI 0.0.47) on the same pair where it imports.
2. `fashion_rescnn`: a CPU-sized residual CNN with BatchNorm on Fashion-MNIST (Debian's
   dataset-fashion-mnist files; MNIST when they are missing, which the md then says): naive, naive with
   BatchNorm statistics reset, weight matching (statistics as interpolated), + reset, + REPAIR.
3. `gpt`: two `symo train` GPTs (4 x 128, 4 heads; seeds 0 and 1; Shakespeare): naive, then two groups
   of heads side by side: heads fixed (identity head owners: each head rotated within its slot) and heads
   permuted as wholes (`perm` owners, each head carrying its own O(d_head) pair: specs.md, Example 4).
   Each without the residual stream (specs/gpt_true.toml and its heads-permuted variant) and with it (the
   inferred spec: a residual permutation; its head owners set to identity for the heads-fixed rows), by
   weights and by activations, + REPAIR; validation loss of the midpoint against both parents.
   `gpt_adamw`: the same with two AdamW runs, to tell the optimizer's part apart. Diagnostics per case:
   each space's weight cosine before and after, the weight objective each group reaches, how many heads
   the permutation moves, how far training moved the weights from their init, the mean activation
   correlation of the units weight and activation matching pair, and why weight matching's heads-permuted
   row can end above its heads-fixed row (`heads_diagnostics`: the permuted result taken apart into the
   heads-fixed result and one exact head step per layer, each step's barrier alone, how the weight score
   ranks activation matching's pairing of heads, and both groups with activation matching's heads or
   residual permutation and the rest by weights).
4. `mha`: two small `nn.MultiheadAttention` classifiers (MNIST rows as a 28-token sequence, 2 pre-LayerNorm
   blocks of 4 heads x 16 and a ReLU MLP, mean-pooled linear head; seeds 0 and 1, one epoch of Adam):
   naive, heads fixed, heads permuted (inferred spec, owners identity or perm), by weights and by
   activations, + REPAIR; the same heads diagnostics as `gpt`.
5. `gpt2_speed`: align time at GPT-2 small widths (d_model 768, 12 heads, vocabulary 50304; random
   weights) against the number of layers, hence of spaces.

Trained models are cached in benchmarks/results/align_cache/ (not committed), so a rerun only aligns.

    python -m benchmarks.align              # everything (about 40 minutes on one loaded thread the first time)
    python -m benchmarks.align --quick      # a smoke run: tiny training, two speed points
    python -m benchmarks.align --cases gpt mha   # those cases only; the others keep their committed rows
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gzip
import itertools
import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import symo
from symo.alignment import AlignError, BarrierResult, barrier
from symo.alignment.matching import (
    best_values,
    head_pair_terms,
    inner_products,
    moving_per_spaces,
    solve_heads,
    weight_matching,
)
from symo.train import TrainConfig, train
from symo.train.data import load_corpus
from symo.train.data_mnist import load_mnist
from symo.train.models import GPT, MLP, GPTConfig

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = RESULTS / "align_cache"
FASHION = Path("/usr/share/datasets/fashion-mnist")
ALPHAS = 11
CASES = ["mnist_mlp", "fashion_rescnn", "gpt", "gpt_adamw", "mha", "gpt2_speed"]
# random starts of weight matching on the transformer rows, besides the identity and solo starts: their
# residual streams have many local optima, and 128 starts reach higher objectives than 0, 16 or 64 on both pairs
RESTARTS = 128
SEARCH = f"weight matching from the identity, solo and {RESTARTS} random starts (seed 0), the best objective kept"


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


class MHAClassifier(nn.Module):
    """A small attention classifier on MNIST rows as a sequence: a linear embedding of each 28-pixel row plus
    a learnt position, `blocks` pre-LayerNorm blocks (nn.MultiheadAttention, then a ReLU MLP), a final
    LayerNorm, mean pooling over the rows, a linear head."""

    def __init__(self, d: int = 64, heads: int = 4, blocks: int = 2, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(28, d)
        self.pos = nn.Parameter(0.02 * torch.randn(28, d))
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, heads, batch_first=True) for _ in range(blocks))
        self.norm1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
        self.norm2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(blocks))
        self.fc1 = nn.ModuleList(nn.Linear(d, hidden) for _ in range(blocks))
        self.fc2 = nn.ModuleList(nn.Linear(hidden, d) for _ in range(blocks))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.view(-1, 28, 28)) + self.pos
        for attn, n1, n2, f1, f2 in zip(self.attn, self.norm1, self.norm2, self.fc1, self.fc2):
            z = n1(h)
            h = h + attn(z, z, z, need_weights=False)[0]
            h = h + f2(F.relu(f1(n2(h))))
        return self.head(self.norm(h).mean(1))

    def example_inputs(self) -> tuple[torch.Tensor]:
        return (torch.randn(4, 784, generator=torch.Generator().manual_seed(0)),)


def heads_as(spec: symo.Spec, group: str) -> symo.Spec:
    """`spec` with every head owner (a space some `per` space names) declared `group`: "identity" keeps each
    head in its slot (rotated within it), "perm" permutes heads as wholes, each with its own rotations."""
    owners = {d.per for d in spec.spaces if d.per}
    spaces = tuple(dataclasses.replace(d, group=group) if d.name in owners else d for d in spec.spaces)
    return symo.Spec(name=f"{spec.name}, heads {group}", spaces=spaces, params=spec.params, source=spec.source)


def heads_moved(result) -> tuple[int, int]:
    """How many heads the element found moves to another slot, of how many (0 for identity owners)."""
    owners = {s.per for s in result.spaces if s.per}
    moved = total = 0
    for name in owners:
        perm = result.elements.get(name)
        size = result.compiled.spaces[name]["size"]
        total += size
        if perm is not None and result.compiled.spaces[name]["group"] == "perm":
            moved += int((torch.as_tensor(perm) != torch.arange(size)).sum())
    return moved, total


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
                          optimizer=optimizer, preset=None, resume=(run / "ckpt.pt").is_file())  # Muon's step
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
    sizes = {"dqk{i}": d_head, "dvo{i}": d_head}
    inferred = symo.infer_spec(a)
    specs = {"gpt_true": symo.load_spec("gpt_true"), "inferred": inferred}
    out, extra = transformer_rows(a, b, lm, val, fit, [
        ("heads fixed + MLP (gpt_true)", heads_as(specs["gpt_true"], "identity"), "weights", sizes),
        ("heads permuted + MLP (gpt_true, perm owners)", heads_as(specs["gpt_true"], "perm"), "weights", sizes),
        ("heads fixed + MLP + residual (inferred, identity owners)", heads_as(inferred, "identity"), "weights", None),
        ("heads permuted + MLP + residual (inferred)", heads_as(inferred, "perm"), "weights", None),
        ("heads fixed (inferred, identity owners)", heads_as(inferred, "identity"), "activations", None),
        ("heads permuted (inferred)", heads_as(inferred, "perm"), "activations", None),
    ], repair=["weights: heads permuted + MLP + residual (inferred)", "activations: heads permuted (inferred)"])
    units = {f"c_fc{i}": f"transformer.h.{i}.mlp.c_proj" for i in range(a.config.n_layer)}
    w = extra["weights: heads permuted + MLP + residual (inferred)"]
    act = extra["activations: heads permuted (inferred)"]
    corr = {m: matched_correlation(a, b, r, fit, units) for m, r in (("weights", w), ("activations", act))}
    heads = heads_note(a, b, lm, val, out, extra, "weights: heads fixed + MLP + residual (inferred, identity owners)",
                       "weights: heads permuted + MLP + residual (inferred)", "activations: heads permuted (inferred)")
    label = {"symo": "Symo defaults (Muon's step, gpt_muon)", "adamw": "AdamW"}[optimizer]
    return out, (f"two `symo train` runs ({steps} steps, batch 16 x 64, {label}, seeds 0 and 1), "
                 f"{sum(p.numel() for p in a.parameters()):,} parameters; validation: 16 batches of 16 x 64; "
                 f"activation statistics and REPAIR's on 8 training batches of 16 x 64; {SEARCH}. "
                 f"{summary(out, extra)} "
                 f"Diagnostics: {_cosines(w)}; training moved the weight matrices by "
                 f"{drift(a, inits[0]):.2f} and {drift(b, inits[1]):.2f} of their init's norm; mean activation "
                 f"correlation of the MLP units each method pairs (heads permuted, with the residual): "
                 f"weights {corr['weights']:.2f}, activations {corr['activations']:.2f}. {heads}")


def transformer_rows(a: nn.Module, b: nn.Module, loss_fn, test: list, fit: list, variants: list,
                     repair: list[str]) -> tuple[dict, dict]:
    """naive, then per variant (label, spec, method, sizes) the barrier after aligning b to a (row
    "method: label"); + REPAIR for the rows named in `repair`, where it applies. Returns the rows and the
    AlignResults by row."""
    out = {"naive": row(barrier(a, b, loss_fn, test, ALPHAS), 0.0)}
    results = {}
    for label, spec, method, sizes in variants:
        key = f"{method}: {label}"
        result, seconds = timed_align(a, b, spec=spec, sizes=sizes, method=method,
                                      data=fit if method == "activations" else None,
                                      restarts=RESTARTS if method == "weights" else 0)
        results[key] = result
        out[key] = row(barrier(a, result.model, loss_fn, test, ALPHAS), seconds)
        moved, total = heads_moved(result)
        located = sum(s.method == "activations" for s in result.spaces)
        out[key].update(objective=result.objective_after, heads_moved=[moved, total],
                        located=[located, len(result.spaces)] if method == "activations" else None,
                        group="heads permuted" if "permuted" in label else "heads fixed")
    for key in repair:
        result = results[key]
        try:
            path = barrier(a, result.model, loss_fn, test, ALPHAS, repair_data=fit, repair_mode="repair")
        except AlignError as exc:  # no bias to fold REPAIR's correction into
            out[f"{key} + REPAIR"] = {"skipped": str(exc)[:300]}
            continue
        out[f"{key} + REPAIR"] = row(path, out[key]["align_seconds"])
    return out, results


def summary(out: dict, results: dict) -> str:
    """Per row: the fraction of the naive barrier removed and, for aligned rows, heads moved and objective."""
    naive = out["naive"]["barrier_loss"]
    parts = []
    for key, r in out.items():
        if key == "naive" or "skipped" in r:
            continue
        part = f"{key}: {100 * (1 - r['barrier_loss'] / naive):.0f}%"
        if "objective" in r:
            part += f" (objective {r['objective']:.3f}, {r['heads_moved'][0]} of {r['heads_moved'][1]} heads moved"
            part += (f", {r['located'][0]} of {r['located'][1]} spaces located by activations)" if r.get("located")
                     else ")")
        parts.append(part)
    skipped = [f"{k}: {r['skipped']}" for k, r in out.items() if "skipped" in r]
    return ("Fraction of the naive barrier removed: " + "; ".join(parts) + "."
            + (" REPAIR not applied: " + "; ".join(skipped) + "." if skipped else ""))


def moved_model(model: nn.Module, compiled, elements: dict) -> nn.Module:
    """A copy of `model` moved by `elements` ({space: (copies, n, n)}) with the compiled spec's group action."""
    params = dict(model.named_parameters())
    moved = compiled.act(elements, {n: params[n].detach() for n in compiled.param_names})
    out = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in out.named_parameters():
            if n in moved:
                p.copy_(moved[n])
    return out


def pairing(q: torch.Tensor) -> list[int]:
    """A head owner's permutation matrix (n, n) as a list: result slot i holds `other`'s head [i]."""
    return [int(j) for j in q.abs().argmax(-1)]


def heads_diagnostics(a: nn.Module, b: nn.Module, loss_fn, test: list, fixed, permuted, act,
                      residual: str = "res") -> dict:
    """Why weight matching's heads-permuted row can end above its heads-fixed row, measured on the pair.

    `fixed`, `permuted`: weight matching's AlignResults with identity and with perm head owners (one spec
    otherwise); `act`: activation matching's with perm owners. Per head owner (one per layer): the heads its
    exact joint step (symo.alignment.matching's head_pair_terms and solve_heads: a linear assignment of head
    pairs, then Procrustes per pair) moves when taken from the heads-fixed result with every other element
    held, the objective gain and the barrier of that step alone, and the rank (1: the best of all n!
    pairings) under the weight score at the heads-permuted result of keeping heads in place and of
    activation matching's pairing. Then: whether the heads-permuted result is exactly the heads-fixed result
    followed by those steps; objective and barrier with activation matching's head pairing (the rest by
    weights); and both groups' objective and barrier with activation matching's `residual` permutation (the
    rest by weights)."""
    compiled = permuted.compiled
    dtype = permuted.matrices[next(iter(permuted.matrices))].dtype
    ref = {n: p.detach().to(dtype) for n, p in a.named_parameters() if n in compiled.param_names}
    other = {n: p.detach().to(dtype) for n, p in b.named_parameters() if n in compiled.param_names}
    owners = [s for s in compiled.spaces if moving_per_spaces(compiled, s)]

    def objective(elements: dict) -> float:
        return sum(inner_products(compiled, elements, ref, other).values())

    def path(elements: dict, spec=None) -> float:
        return barrier(a, moved_model(b, spec or compiled, elements), loss_fn, test, ALPHAS).barrier("loss")

    def rank(score: torch.Tensor, p: list[int]) -> int | None:
        n = score.shape[0]
        if n > 8:  # 8! pairings at most
            return None
        value = float(score[torch.arange(n), torch.as_tensor(p)].sum())
        others = (float(score[torch.arange(n), torch.as_tensor(r)].sum()) for r in itertools.permutations(range(n)))
        return 1 + sum(v > value + 1e-9 * abs(value) for v in others)

    start = {s: q.to(dtype) for s, q in fixed.matrices.items()}
    base = objective(start)
    stepped, layers = dict(start), {}
    for owner in owners:
        owned = moving_per_spaces(compiled, owner)
        groups = {t: compiled.spaces[t]["group"] for t in owned}
        c0, cross = head_pair_terms(compiled, start, owner, owned, ref, other)
        q, rotations, _ = solve_heads(compiled.spaces[owner]["group"], c0, {t: (groups[t], cross[t]) for t in owned})
        step = {owner: q.to(dtype).unsqueeze(0), **{t: r.to(dtype) for t, r in rotations.items()}}
        stepped.update(step)
        moved = pairing(q)
        alone = {**start, **step}
        c0, cross = head_pair_terms(compiled, permuted.matrices, owner, owned, ref, other)
        score = c0 + sum(best_values(groups[t], cross[t]) for t in owned)
        layers[owner] = {"heads": moved, "gain": objective(alone) - base,
                         "barrier": path(alone) if moved != sorted(moved) else None,
                         "rank_in_place": rank(score, list(range(len(moved)))),
                         "activations": pairing(act.matrices[owner][0]),
                         "rank_activations": rank(score, pairing(act.matrices[owner][0])),
                         "pairings": math.factorial(len(moved))}
    rest = [s for s in compiled.spaces if s not in owners and compiled.spaces[s]["per"] not in owners]
    same = all(torch.equal(stepped[s], permuted.matrices[s].to(dtype)) for s in rest + owners) and all(
        torch.allclose(stepped[t], permuted.matrices[t].to(dtype), atol=1e-5) for o in owners
        for t in moving_per_spaces(compiled, o))
    heads_act = weight_matching(compiled, ref, other, fixed={o: act.matrices[o].to(dtype) for o in owners})
    out = {"layers": layers, "fixed_then_heads_step": same, "fixed_objective": base,
           "permuted_objective": permuted.objective_after,
           "heads_from_activations": {"objective": heads_act.objective_after, "barrier": path(heads_act.elements)}}
    if residual in compiled.spaces and residual in act.matrices:
        located = {residual: act.matrices[residual].to(dtype)}
        for label, result in (("fixed", fixed), ("permuted", permuted)):
            m = weight_matching(result.compiled, ref, other, fixed=located)
            out[f"residual_from_activations_{label}"] = {"objective": m.objective_after,
                                                         "barrier": path(m.elements, result.compiled)}
    return out


def heads_note(a: nn.Module, b: nn.Module, loss_fn, test: list, out: dict, results: dict, fixed: str, permuted: str,
               act: str) -> str:
    """heads_diagnostics for the rows `fixed`, `permuted` (weight matching) and `act` (activation matching): kept
    in the permuted row (align.json) and returned in words."""
    d = heads_diagnostics(a, b, loss_fn, test, results[fixed], results[permuted], results[act])
    out[permuted]["heads_diagnostics"] = d
    return heads_text(d, out[fixed]["barrier_loss"], out[permuted]["barrier_loss"])


def heads_text(d: dict, fixed_barrier: float, permuted_barrier: float) -> str:
    """heads_diagnostics in words, for the case's note (every comparison worded from the numbers)."""
    gain = d["permuted_objective"] - d["fixed_objective"]
    same = d["fixed_then_heads_step"]
    text = (f"Heads permuted against heads fixed (weight matching): the heads-permuted result "
            f"{'is exactly' if same else 'is not'} the heads-fixed result followed by one exact head step per layer "
            f"(the linear assignment of head pairs, every other element held"
            f"{': the residual and MLP permutations are the same' if same else ''}); the permuted group raises the "
            f"objective by {gain:.4f} ({100 * gain / abs(d['fixed_objective']):.3f}%) and moves the barrier from "
            f"{fixed_barrier:.4f} to {permuted_barrier:.4f}. Per layer, the heads each slot takes, the step's "
            f"objective gain and the barrier with that layer's step alone, then the rank (1: best) of keeping heads "
            f"in place and of activation matching's pairing among all pairings under the weight score: ")
    text += "; ".join(
        f"{o} {v['heads']} ({(v['gain'] if abs(v['gain']) >= 5e-5 else 0.0):+.4f}, "
        + (f"barrier {v['barrier']:.4f}" if v["barrier"] is not None else "no head moved")
        + f"; in place {v['rank_in_place']}, activations' {v['activations']} {v['rank_activations']} "
        f"of {v['pairings']})"
        for o, v in d["layers"].items()) + "."
    h = d["heads_from_activations"]
    text += (f" With activation matching's head pairing and the rest by weights: objective {h['objective']:.3f} "
             f"({'lower' if h['objective'] < d['permuted_objective'] else 'not lower'} than the permuted group's), "
             f"barrier {h['barrier']:.4f}.")
    if "residual_from_activations_fixed" in d:
        f, p = d["residual_from_activations_fixed"], d["residual_from_activations_permuted"]
        higher = f["objective"] > d["fixed_objective"] and p["objective"] > d["permuted_objective"]
        text += (f" With activation matching's residual permutation and the rest by weights: objective "
                 f"{f['objective']:.3f} (heads fixed) and {p['objective']:.3f} (permuted), "
                 f"{'both higher than' if higher else 'not both higher than'} weight matching's own descent reaches, "
                 f"barriers {f['barrier']:.4f} and {p['barrier']:.4f}.")
    return text

def case_mha(quick: bool) -> tuple[dict, str]:
    x, y, xt, yt = load_mnist()
    n = 6000 if quick else 30000  # half the training set: about a minute of training per model
    make = MHAClassifier
    a, b = (train_classifier(make, x[:n], y[:n], s, 1, 128, 2e-3, CACHE / f"mha_n{n}_s{s}.pt") for s in (0, 1))
    test = [(xt[i:i + 2500], yt[i:i + 2500]) for i in range(0, 5000, 2500)]
    fit = [x[i:i + 500] for i in range(0, 2000, 500)]
    inferred = symo.infer_spec(a)
    out, extra = transformer_rows(a, b, classify, test, fit, [
        ("heads fixed (inferred, identity owners)", heads_as(inferred, "identity"), "weights", None),
        ("heads permuted (inferred)", heads_as(inferred, "perm"), "weights", None),
        ("heads fixed (inferred, identity owners)", heads_as(inferred, "identity"), "activations", None),
        ("heads permuted (inferred)", heads_as(inferred, "perm"), "activations", None),
    ], repair=["weights: heads permuted (inferred)", "activations: heads permuted (inferred)"])
    w = extra["weights: heads permuted (inferred)"]
    heads = heads_note(a, b, classify, test, out, extra, "weights: heads fixed (inferred, identity owners)",
                       "weights: heads permuted (inferred)", "activations: heads permuted (inferred)")
    inits = [_init(make, s) for s in (0, 1)]
    return out, (f"MNIST rows as a 28-token sequence; MHAClassifier (d 64, 2 blocks of nn.MultiheadAttention with 4 "
                 f"heads of 16, ReLU MLP 128, pre-LayerNorm; {sum(p.numel() for p in a.parameters()):,} parameters), "
                 f"one epoch of Adam (lr 2e-3, batch 128) on {n:,} training images per model; test loss on the first "
                 f"5,000 test images; activation statistics and REPAIR's on 2,000 training images; spec inferred: "
                 f"{_spaces(w)}; {SEARCH}. {summary(out, extra)} Diagnostics: {_cosines(w)}; training moved the weight "
                 f"matrices "
                 f"by {drift(a, inits[0]):.2f} and {drift(b, inits[1]):.2f} of their init's norm. {heads}")


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
TITLES = {"mnist_mlp": "MNIST MLP (3 x 512 ReLU), test set",
          "fashion_rescnn": "Residual CNN with BatchNorm, test set",
          "gpt": "Character GPT 4 x 128 trained with Symo, validation",
          "gpt_adamw": "Character GPT 4 x 128 trained with AdamW, validation",
          "mha": "nn.MultiheadAttention classifier on MNIST rows, test set",
          "gpt2_speed": "Align time at GPT-2 small widths"}


def committed_notes() -> dict[str, str]:
    """Each case's note as the committed align.md has it (the first paragraph under its title), so a run of
    some cases keeps the others' notes where the cache's notes.json is gone."""
    md = RESULTS / "align.md"
    if not md.is_file():
        return {}
    by_title = {v: k for k, v in TITLES.items()}
    notes = {}
    for section in md.read_text().split("\n## ")[1:]:
        title, _, body = section.partition("\n\n")
        if title.strip() in by_title and body.strip():
            notes[by_title[title.strip()]] = body.split("\n\n")[0].strip()
    return notes


def write(results: dict, notes: dict, argv: str, seconds: float) -> None:
    """align.{json,md,png}; cases not run this time keep their previous rows and notes."""
    RESULTS.mkdir(exist_ok=True)
    old = RESULTS / "align.json"
    old_notes = CACHE / "notes.json"
    if old.is_file():
        results = {**json.loads(old.read_text()), **results}
    if old_notes.is_file():
        notes = {**json.loads(old_notes.read_text()), **notes}
    notes = {**committed_notes(), **notes}
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
    for case, rows in results.items():
        lines += [f"## {TITLES[case]}", "", notes.get(case, "(notes: see the run that wrote these rows)"), ""]
        if case == "gpt2_speed":
            lines += ["| layers | parameters | spaces | sweeps | align seconds | matching seconds | best start |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {k.split()[0]} | {r['params']:,} | {r['spaces']} | {r['sweeps']} | "
                      f"{r['align_seconds']:.1f} | {r['match_seconds']:.1f} | {r['start']} |" for k, r in rows.items()]
        else:
            ends = rows["naive"]["end_losses"]
            naive = rows["naive"]["barrier_loss"]
            lines += [f"End points: loss {ends[0]:.4f} (A), {ends[1]:.4f} (B).", "",
                      "| method | loss barrier | of the naive barrier removed | accuracy barrier | midpoint loss | "
                      "midpoint accuracy | align s |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {m} | (not applied: {r['skipped']}) | | | | | |" if "skipped" in r else
                      f"| {m} | {r['barrier_loss']:.4f} | {100 * (1 - r['barrier_loss'] / naive):.0f}% | "
                      f"{100 * r['barrier_acc']:.2f}% | {r['midpoint_loss']:.4f} | {100 * r['midpoint_acc']:.2f}% | "
                      f"{r['align_seconds']:.2f} |" for m, r in rows.items()]
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
    cases = [c for c in ("mnist_mlp", "fashion_rescnn", "gpt", "gpt_adamw", "mha") if c in results]
    fig, axes = plt.subplots(1, len(cases) + ("gpt2_speed" in results), figsize=(4.2 * (len(cases) + 1), 6.0))
    axes = np.atleast_1d(axes)
    for ax, case in zip(axes, cases):
        for method, r in results[case].items():
            if "skipped" in r:
                continue
            ax.plot(r["alphas"], r["losses"], marker="o", ms=3, label=method)
        ax.set_title(case)
        ax.set_xlabel("alpha (0: A, 1: B aligned)")
        ax.set_ylabel("loss")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2))  # below: long method names
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
               "gpt_adamw": lambda quick: case_gpt(quick, "adamw"), "mha": case_mha, "gpt2_speed": case_speed}
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
