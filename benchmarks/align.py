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
import time

import torch
from torch import nn

import symo
from benchmarks.align_heads import ALPHAS, heads_as, heads_moved, heads_note
from benchmarks.align_models import (
    MHAClassifier,
    ResCNN,
    classify,
    drift,
    initial_model,
    load_fashion,
    train_classifier,
)
from benchmarks.align_report import CACHE, CASES, RESULTS, write
from symo.alignment import AlignError, BarrierResult, barrier
from symo.train import TrainConfig, train
from symo.train.data import load_corpus
from symo.train.data_mnist import load_mnist
from symo.train.models import GPT, MLP, GPTConfig

# random starts of weight matching on the transformer rows, besides the identity and solo starts: their
# residual streams have many local optima, and 128 starts reach higher objectives than 0, 16 or 64 on both pairs
RESTARTS = 128
SEARCH = f"weight matching from the identity, solo and {RESTARTS} random starts (seed 0), the best objective kept"


# ---------------------------------------------------------------- helpers of the cases
def row(path: BarrierResult, seconds: float | None, acc: bool = True) -> dict:
    return {"barrier_loss": path.barrier("loss"), "barrier_acc": path.barrier("acc") if acc else None,
            "midpoint_loss": path.midpoint("loss"), "align_seconds": seconds,
            "midpoint_acc": path.midpoint("acc") if acc else None,
            "end_losses": [path.values["loss"][0], path.values["loss"][-1]], "alphas": path.alphas,
            "losses": path.values["loss"], "accs": path.values.get("acc")}


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
    inits = [initial_model(make, s) for s in (0, 1)]
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
    inits = [initial_model(ResCNN, s) for s in (0, 1)]
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
                          optimizer=optimizer, preset=None, weight_decay=0.0,  # Muon's step, no decay
                          resume=(run / "ckpt.pt").is_file())
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
    inits = [initial_model(make, s) for s in (0, 1)]
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
