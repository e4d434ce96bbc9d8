"""Per-step optimizer overhead on GPT-shaped parameters (symo.models.gpt_bench: 6 layers, d_model 384).

Random gradients are written into `.grad` (no forward/backward), so the numbers are the optimizer's own
cost: median seconds per `step()` after warm-up, as ratios to AdamW and to Muon measured in the same
run, and the bytes held in optimizer-state tensors.

    python -m benchmarks.step_overhead             # full run (a few minutes on 2 CPU cores)
    python -m benchmarks.step_overhead --quick     # smoke run
    python -m benchmarks.step_overhead --steps 20 --no-compile --device cuda
    python -m benchmarks.step_overhead --only soap --out benchmarks/results/step_overhead_soap.md   # SOAP rows

Optimizers: torch AdamW (all parameters); the reference Muon (tests/references.py, the published algorithm) on the
hidden matrices + torch AdamW on the rest; Symo with specs/gpt_muon.toml (Muon-style, eager and torch.compile'd);
Symo with specs/gpt.toml (per-head gauges); the reference Shampoo (float64 eigh every step, as published) on the
hidden matrices + AdamW; SOAP from Symo's preset, pytorch-optimizer and heavyball; SOAP-Muon (Symo's soap_muon,
symo train's default step) on gpt_muon.toml and on gpt_muon_qkv.toml (symo train's default spec), and on the latter
without SOAP's rotation (max_precond_dim=1). The table goes to stdout and to benchmarks/results/step_overhead.md.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.step_overhead_accuracy import bf16_accuracy, spectral_accuracy
from symo.optim import Symo
from symo.train.models import gpt_bench

ROOT = Path(__file__).resolve().parent.parent


def _references():
    if str(ROOT / "tests") not in sys.path:  # references.py takes its shared reference helpers from tests/
        sys.path.insert(0, str(ROOT / "tests"))
    spec = importlib.util.spec_from_file_location("symo_test_references", ROOT / "tests" / "references.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASELINES = ("AdamW (torch)", "Muon (reference) + AdamW")


def _is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """Muon's set: 2-D weights inside the transformer blocks (not embeddings / lm_head)."""
    return p.ndim == 2 and ".h." in name


def state_bytes(*opts: torch.optim.Optimizer) -> int:
    def walk(v):
        if torch.is_tensor(v):
            yield v
        elif isinstance(v, dict):
            for x in v.values():
                yield from walk(x)
        elif isinstance(v, (list, tuple)):  # the libraries' SOAP keeps its factors in lists
            for x in v:
                yield from walk(x)

    return sum(t.numel() * t.element_size() for o in opts for v in o.state.values() for t in walk(v))


class Combo:
    """Several torch optimizers stepped together (Muon / Shampoo + AdamW for the rest)."""

    def __init__(self, *opts: torch.optim.Optimizer) -> None:
        self.opts = opts

    def step(self) -> None:
        for o in self.opts:
            o.step()


def _per_layer(spec: str, model: torch.nn.Module):
    """The spec compiled without templates (`templates=False`): one copy of the code per layer."""
    from symo.compiler import compile_spec, load_spec

    from symo import CompiledSpec

    return CompiledSpec(compile_spec(load_spec(ROOT / "specs" / spec), model, disk_cache=False, templates=False))


def make_optimizers(compile_step: bool, refs) -> dict[str, Callable[[torch.nn.Module], object]]:
    adam_kw = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)

    def split(model):
        named = list(model.named_parameters())
        return ([p for n, p in named if _is_hidden_matrix(n, p)],
                [p for n, p in named if not _is_hidden_matrix(n, p)])

    makers = {
        "AdamW (torch)": lambda m: torch.optim.AdamW(m.parameters(), **adam_kw),
        "Muon (reference) + AdamW": lambda m: Combo(refs.ReferenceMuon(split(m)[0], lr=0.02),
                                                    torch.optim.AdamW(split(m)[1], **adam_kw)),
        "Symo Muon-style (gpt_muon.toml)": lambda m: Symo(m.named_parameters(), ROOT / "specs" / "gpt_muon.toml",
                                                           lr=0.02, update_scale="muon"),
        "Symo per-head (gpt.toml)": lambda m: Symo(m.named_parameters(), ROOT / "specs" / "gpt.toml", lr=1e-3),
        # the same two with Newton-Schulz as the matrix-product iteration (as Muon runs it), not through
        # one eigh of the smaller Gram (ns_method="auto" picks that on CPU): the before/after of the
        # spectral evaluation
        "Symo Muon-style, ns_method=iterate": lambda m: Symo(m.named_parameters(), ROOT / "specs" / "gpt_muon.toml",
                                                             lr=0.02, update_scale="muon", ns_method="iterate"),
        "Symo per-head, ns_method=iterate": lambda m: Symo(m.named_parameters(), ROOT / "specs" / "gpt.toml", lr=1e-3,
                                                           ns_method="iterate"),
        # the same two stacking same-shape blocks into one batched call (batch_blocks='auto' does not on CPU)
        "Symo Muon-style, batched": lambda m: Symo(m.named_parameters(), ROOT / "specs" / "gpt_muon.toml",
                                                     lr=0.02, update_scale="muon", batch_blocks=True),
        "Symo per-head, batched": lambda m: Symo(m.named_parameters(), ROOT / "specs" / "gpt.toml", lr=1e-3,
                                                   batch_blocks=True),
        # the two specs with the per-layer generated code (templates=False): what a loop over layers
        # in gather/scatter (compile once per template) costs at run time
        "Symo Muon-style, per-layer code": lambda m: Symo(m.named_parameters(), _per_layer("gpt_muon.toml", m),
                                                          lr=0.02, update_scale="muon"),
        "Symo per-head, per-layer code": lambda m: Symo(m.named_parameters(), _per_layer("gpt.toml", m), lr=1e-3),
    }
    # the presets: muon (the iteration, as Muon runs it) and notebook (an EMA of the block statistics and
    # an exact power every step), the latter with float64 statistics (the default) and with float32:
    # what keeping the statistics and their eigh in float64 costs
    makers["Symo preset=muon (gpt_muon.toml)"] = lambda m: Symo(m.named_parameters(), ROOT / "specs" / "gpt_muon.toml",
                                                                preset="muon")
    for spec, label in (("gpt.toml", "per-head"),):
        for stats in ("float64", "float32"):
            makers[f"Symo preset=notebook, {label} ({spec}), {stats} statistics"] = (
                lambda m, spec=spec, stats=stats: Symo(m.named_parameters(), ROOT / "specs" / spec, preset="notebook",
                                                       stats_dtype=stats))
    # the preconditioner kinds on the true-symmetry spec (per-head O(d_head) gauges, perm MLP units), each with its
    # factors refreshed every step and every 10 steps, beside the polar kind (Symo's defaults) on the same spec
    true_sizes = {"dqk{i}": 64, "dvo{i}": 64}  # gpt_bench: 6 heads of 64
    makers["Symo defaults (gpt_true.toml)"] = lambda m: Symo(m.named_parameters(), "gpt_true", sizes=true_sizes,
                                                             lr=0.02, update_scale="muon")
    for kind in ("published", "eigen_adam", "then_orthogonalize"):
        for freq in (1, 10):
            makers[f"Symo {kind}, refresh {freq} (gpt_true.toml)"] = (
                lambda m, kind=kind, freq=freq: Symo(m.named_parameters(), "gpt_true", sizes=true_sizes, preset=kind,
                                                     precondition_frequency=freq))
    # SOAP: Symo's preset (both sides from the Muon-style spec) at the authors' refresh every 10 steps and at
    # heavyball's every 2, beside the two libraries' SOAP on the hidden matrices (AdamW on the rest)
    for freq in (10, 2):
        makers[f"Symo soap, refresh {freq} (gpt_muon.toml)"] = (
            lambda m, freq=freq: Symo(m.named_parameters(), ROOT / "specs" / "gpt_muon.toml", preset="soap",
                                      precondition_frequency=freq))
    # SOAP-Muon, symo train's default step: the polar factor of SOAP's direction, refreshed every 10 steps, on the
    # Muon-style spec and on symo train's default spec (c_attn's query, key and value as three blocks)
    for spec in ("gpt_muon", "gpt_muon_qkv"):
        makers[f"Symo soap_muon, refresh 10 ({spec}.toml)"] = lambda m, spec=spec: Symo(
            m.named_parameters(), ROOT / "specs" / f"{spec}.toml", preset="soap_muon")
    # SOAP-Muon without SOAP's rotation (no side rotated: Adam's second moment in the weights' coordinates, then the
    # polar factor), which keeps no statistics or bases
    makers["Symo soap_muon, no side rotated (max_precond_dim 1, gpt_muon_qkv.toml)"] = lambda m: Symo(
        m.named_parameters(), ROOT / "specs" / "gpt_muon_qkv.toml", preset="soap_muon", max_precond_dim=1)
    makers["SOAP (pytorch-optimizer), refresh 10 + AdamW"] = lambda m: Combo(
        library_soap("pytorch_optimizer", split(m)[0]), torch.optim.AdamW(split(m)[1], **adam_kw))
    makers["SOAP (heavyball), refresh 2 + AdamW"] = lambda m: Combo(
        library_soap("heavyball", split(m)[0]), torch.optim.AdamW(split(m)[1], **adam_kw))
    if compile_step:
        makers["Symo Muon-style, torch.compile"] = lambda m: Symo(
            m.named_parameters(), ROOT / "specs" / "gpt_muon.toml", lr=0.02, update_scale="muon", compile=True)
    makers["Shampoo (reference) + AdamW"] = lambda m: Combo(refs.ReferenceShampoo(split(m)[0], lr=1e-3, eps=1e-12),
                                                            torch.optim.AdamW(split(m)[1], **adam_kw))
    return makers


def library_soap(library: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """A library's SOAP with its documented defaults (heavyball without torch.compile, as the campaign runs it)."""
    if library == "heavyball":
        import heavyball  # a benchmark dependency (the bench extra)
        import heavyball.utils

        heavyball.utils.compile_mode = None
        return heavyball.SOAP(params, lr=3e-3, weight_decay=0.0)
    import pytorch_optimizer  # a benchmark dependency (the bench extra)

    return pytorch_optimizer.SOAP(params, lr=3e-3, weight_decay=0.0)


def is_slow(name: str) -> bool:
    """Rows whose every step is seconds long: timed on fewer steps (--slow-steps) so the run stays short."""
    return name.startswith("Shampoo") or name.startswith("Symo published, refresh 1 ")


def one_step(model: torch.nn.Module, opt, grads: list[torch.Tensor], sync: Callable[[], None]) -> float:
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    sync()
    start = time.perf_counter()
    opt.step()
    sync()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per optimizer (median reported)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="3 timed steps, 1 warm-up, Shampoo 1 step")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd Symo step")
    ap.add_argument("--slow-steps", type=int, default=2,
                    help="timed steps for the slow rows (Shampoo; the published step refreshed every step)")
    ap.add_argument("--only", default=None,
                    help="time only the rows whose name contains this text, any case (AdamW and Muon, the baselines, "
                         "always)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "step_overhead.md"))
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.slow_steps = 3, 1, 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    refs = _references()

    torch.manual_seed(0)
    base = gpt_bench().to(device)
    gen = torch.Generator(device=device).manual_seed(1)
    grads = [[0.01 * torch.randn(p.shape, generator=gen, device=device) for p in base.parameters()]
             for _ in range(3)]
    n_params = sum(p.numel() for p in base.parameters())
    # every optimizer gets its own copy of the model; after warm-up they are timed in interleaved
    # rounds, so background load on a shared machine hits them all alike
    runs, results = {}, {}
    for name, make in make_optimizers(not args.no_compile, refs).items():
        if args.only is not None and args.only.lower() not in name.lower() and name not in BASELINES:
            continue
        model = copy.deepcopy(base)
        try:
            opt = make(model)
            start = time.perf_counter()
            for i in range(1 if is_slow(name) else args.warmup):
                one_step(model, opt, grads[i % 3], sync)
            warm = time.perf_counter() - start
        except Exception as exc:  # e.g. torch.compile without a working C++ toolchain
            results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"}
            print(f"{name}: FAILED ({results[name]['error']})", flush=True)
            continue
        runs[name] = (model, opt, [])
        results[name] = {"warmup_s": warm}
        print(f"{name}: warm-up {warm:.1f} s", flush=True)
    for r in range(args.steps):
        for name, (model, opt, times) in runs.items():
            if is_slow(name) and r >= args.slow_steps:
                continue
            times.append(one_step(model, opt, grads[r % 3], sync))
    for name, (_, opt, times) in runs.items():
        # the mean counts the steps that refresh factors every k steps; the median shows the steps between. The
        # state is counted after the timed steps: SOAP's first step only builds its statistics, and Symo allocates
        # Adam's second moment at the first update, so after one warm-up step that state is not there yet
        inner = opt.opts if isinstance(opt, Combo) else (opt,)
        results[name].update(median=statistics.median(times), mean=statistics.mean(times), min=min(times),
                             steps=len(times), bytes=state_bytes(*inner))
        print(f"{name}: {results[name]['median'] * 1e3:.1f} ms/step", flush=True)

    adam = results[BASELINES[0]]["median"]
    muon = results[BASELINES[1]]["median"]
    adam_bytes = results["AdamW (torch)"]["bytes"]
    rows = ["| optimizer | median ms/step | mean ms | x AdamW | x Muon | mean x Muon | state MB | state / AdamW | "
            "steps |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    muon_mean = results["Muon (reference) + AdamW"]["mean"]
    for name, r in results.items():
        if "error" in r:
            rows.append(f"| {name} | failed: {r['error']} | | | | | | | |")
            continue
        rows.append(f"| {name} | {r['median'] * 1e3:.1f} | {r['mean'] * 1e3:.1f} | {r['median'] / adam:.2f} | "
                    f"{r['median'] / muon:.2f} | {r['mean'] / muon_mean:.2f} | {r['bytes'] / 2**20:.1f} | "
                    f"{r['bytes'] / adam_bytes:.2f} | {r['steps']} |")
    notes = []
    if "Symo Muon-style, torch.compile" in results and "error" not in results["Symo Muon-style, torch.compile"]:
        notes.append(f"torch.compile warm-up (compilation included): "
                     f"{results['Symo Muon-style, torch.compile']['warmup_s']:.1f} s")
    sym = results.get("Symo Muon-style (gpt_muon.toml)", {})
    if "median" in sym:
        notes.append(f"target: Symo Muon-style <= 0.9x Muon -> {sym['median'] / muon:.2f}x; "
                     f"state <= 0.51x AdamW -> {sym['bytes'] / adam_bytes:.2f}x")
    head = results.get("Symo per-head (gpt.toml)", {})
    if "median" in head:
        notes.append(f"target: Symo per-head <= 1.0x Muon -> {head['median'] / muon:.2f}x; "
                     f"state {head['bytes'] / adam_bytes:.2f}x AdamW")
    # each default Symo row against its variants: what templates, the spectral evaluation and batching buy
    variants = ((", per-layer code", "generated code looping over layers (templates, the default) / one copy per "
                                     "layer (templates=False)"),
                (", ns_method=iterate", "ns_method='auto' (on CPU: Newton-Schulz through one eigh of the smaller "
                                        "Gram) / the iteration"),
                (", batched", "batch_blocks='auto' (no stacking on CPU) / stacking same-shape blocks"))
    for default, prefix in (("Symo Muon-style (gpt_muon.toml)", "Symo Muon-style"),
                            ("Symo per-head (gpt.toml)", "Symo per-head")):
        for suffix, what in variants:
            a, b = results.get(default, {}), results.get(prefix + suffix, {})
            if "median" in a and "median" in b:
                notes.append(f"{default}: step time, {what}: {a['median'] / b['median']:.2f}x")
    for label in ("per-head (gpt.toml)",):
        a = results.get(f"Symo preset=notebook, {label}, float64 statistics", {})
        b = results.get(f"Symo preset=notebook, {label}, float32 statistics", {})
        if "median" in a and "median" in b:
            notes.append(f"Symo preset=notebook, {label}: step time with float64 statistics (the default) / float32: "
                         f"{a['median'] / b['median']:.2f}x; state {a['bytes'] / b['bytes']:.2f}x")
    header = [
        "# Optimizer step overhead (benchmarks/step_overhead.py)",
        "",
        "Command: `" + " ".join(["python", "-m", "benchmarks.step_overhead",
                                 *(sys.argv[1:] if argv is None else argv)]) + "`",
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"device {device}, torch {torch.__version__}; model gpt_bench ({n_params / 1e6:.2f} M parameters), "
        f"float32, random gradients; median over timed steps after {args.warmup} warm-up step(s) "
        f"(the slow rows, Shampoo and the published step refreshed every step: {args.slow_steps} step(s) after 1).",
        "",
    ]
    step_json = {name: {"ms": r["median"] * 1e3, "mean_ms": r["mean"] * 1e3, "x_muon": r["median"] / muon,
                         "mean_x_muon": r["mean"] / muon_mean, "x_adamw": r["median"] / adam,
                         "state_x_adamw": r["bytes"] / adam_bytes} for name, r in results.items() if "median" in r}
    for freq, library in ((10, "pytorch-optimizer"), (2, "heavyball")):
        ours, theirs = results.get(f"Symo soap, refresh {freq} (gpt_muon.toml)", {}), results.get(
            f"SOAP ({library}), refresh {freq} + AdamW", {})
        if "mean" in ours and "mean" in theirs:
            notes.append(f"Symo soap / SOAP ({library}), both refreshing every {freq} steps: mean step "
                         f"{ours['mean'] / theirs['mean']:.2f}x (goal <= 1), "
                         f"state {ours['bytes'] / theirs['bytes']:.2f}x")
    for kind in ("published", "eigen_adam", "then_orthogonalize"):
        r10 = results.get(f"Symo {kind}, refresh 10 (gpt_true.toml)", {})
        if "mean" in r10:
            notes.append(f"Symo {kind} on gpt_true, refresh 10: {r10['mean'] / muon_mean:.2f}x Muon's mean step "
                         f"(goal 1.3x), state {r10['bytes'] / adam_bytes:.2f}x AdamW's")
    ns = bf16_accuracy(device)
    notes.append(f"bfloat16 Newton-Schulz (ns_dtype='bfloat16') on a {ns['shape']} Gaussian, 5 quintic steps: "
                 f"relative distance to the float32 iteration {ns['bf16_vs_f32']:.3f}; to the float64 polar "
                 f"factor: float32 {ns['f32_vs_polar']:.3f}, bfloat16 {ns['bf16_vs_polar']:.3f} (Muon's quintic "
                 "leaves singular values in ~[0.7, 1.2] by design)")
    sp = spectral_accuracy()
    notes.append("Newton-Schulz through one eigh (linalg.newton_schulz_spectral), float32 data, relative distance to "
                 "the float64 iteration (float32 iteration in brackets): "
                 + "; ".join(f"{k} {v['spectral']:.1e} ({v['iterate']:.1e})" for k, v in sp.items()))
    json_path = Path(args.out).with_suffix(".json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"step": step_json, "ns_bf16": ns, "ns_spectral": sp, "device": str(device),
                                     "torch_threads": torch.get_num_threads()}, indent=2) + "\n")
    text = "\n".join(header + rows + [""] + [f"- {n}" for n in notes]) + "\n"
    print()
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"written to {out}")
    plot(results, out.with_suffix(".png"))


def plot(results: dict, path: Path) -> None:
    """Two bar charts (ms/step on a log axis, state MB) as a PNG; needs matplotlib (extra 'bench')."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plot")
        return
    ok = {n: r for n, r in results.items() if "median" in r}
    names = list(ok)[::-1]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 0.5 * len(names) + 1.5), sharey=True)
    colors = ["tab:blue" if n.startswith("Symo") else "tab:gray" for n in names]
    a.barh(names, [ok[n]["median"] * 1e3 for n in names], color=colors)
    a.set_xscale("log")
    a.set_xlabel("ms per optimizer step (median, log scale)")
    b.barh(names, [ok[n]["bytes"] / 2**20 for n in names], color=colors)
    b.set_xlabel("optimizer state (MB)")
    fig.suptitle("Optimizer step overhead on GPT shapes (6 layers, d_model 384), CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
