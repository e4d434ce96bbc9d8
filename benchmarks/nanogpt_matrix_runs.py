"""The nanoGPT campaign's regimes and arms (benchmarks/nanogpt_matrix.py), and one run of an arm: its
optimizer, its training in a worker process, and the interleaved timing of the chosen configurations."""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import interleaved_ms_per_step
from symo.optim.bases import Eigh, PowerQR

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NAME = "nanogpt_matrix"
COMMON = {"batch_size": 32, "block_size": 128, "steps": 1000, "eval_interval": 20, "eval_batches": 4,
          "warmup": 20, "adamw_lr": 3e-3}
REGIMES: dict[str, dict[str, Any]] = {
    "reference": dict(COMMON, n_layer=4, n_head=4, n_embd=128),
    "data_rich": dict(COMMON, n_layer=2, n_head=4, n_embd=64),
    # the screening pass: the reference model at a quarter of its tokens per step and half its steps
    "screen": dict(COMMON, n_layer=4, n_head=4, n_embd=128, batch_size=16, block_size=64, steps=500),
}
TUNED_REGIMES = ("reference", "data_rich")
QUICK = {"batch_size": 4, "block_size": 16, "steps": 10, "eval_interval": 5, "eval_batches": 1, "warmup": 2,
         "adamw_lr": 3e-3, "n_layer": 1, "n_head": 2, "n_embd": 32}

# eigen_adam's conventions before SOAP's became its defaults (symo/optim/kinds/eigen_adam.py documents each)
OLDER_EIGEN_ADAM = {"first_step": "update", "statistic_timing": "before", "refresh": Eigh(), "null_directions": "drop",
                    "eps_placement": "adam", "max_precond_dim": 2048}

# SOAP-Muon: the polar factor of SOAP's direction, both sides from one spec, Muon's scale
SOAP_MUON = {"preset": "then_orthogonalize", "inner": "eigen_adam", "two_sided": True, "stats_dtype": "float32"}

LABELS = {"eigen_adam": "eigen_adam (older conventions)", "one_sided_soap": "eigen_adam (one-sided SOAP)",
          "soap": "soap", "soap_muon": "SOAP-Muon"}
# arm -> how it is built and its starting learning-rate grid (hidden matrices; AdamW: every parameter)
ARMS: dict[str, dict[str, Any]] = {
    "adamw": {"kind": "adamw", "grid": [2e-3, 4e-3, 8e-3], "label": "AdamW"},
    "muon": {"kind": "muon", "grid": [0.01, 0.02, 0.04], "label": "Muon"},
    "soap": {"kind": "heavyball", "class": "SOAP", "grid": [1.5e-3, 3e-3, 6e-3], "label": "SOAP (heavyball)"},
    "kron": {"kind": "heavyball", "class": "PSGDKron", "grid": [5e-4, 1e-3, 2e-3],
             "label": "PSGD-Kron (heavyball)"},
    # the authors' SOAP as pytorch-optimizer ports it (its defaults: betas 0.95, refresh every 10)
    "soap_authors": {"kind": "pytorch_optimizer", "class": "SOAP", "grid": [1.5e-3, 3e-3, 6e-3],
                     "label": "SOAP (pytorch-optimizer, the authors' algorithm)"},
    # NorMuon (Muon, then each row of the polar factor divided by an EMA of its mean square, back to the polar
    # factor's norm) as pytorch-optimizer ships it, at its defaults: whether a published step past Muon reaches
    # Muon's final loss in 0.85x its steps here at all
    # (its Newton-Schulz in float32, as the Muon arm's: the library's bfloat16 is emulated on CPUs, 15x slower)
    "normuon": {"kind": "pytorch_optimizer", "class": "NorMuon", "group": {"use_muon": True},
                "newton_schulz_float32": True, "grid": [0.01, 0.02, 0.04], "label": "NorMuon (pytorch-optimizer)"},
    "symo_defaults_gpt_muon": {"kind": "symo", "spec": "gpt_muon", "options": {"update_scale": "muon"},
                               "grid": [0.01, 0.02, 0.04], "label": "Symo defaults, gpt_muon"},
    # gpt_true under Muon's scale: these arms' runs were made with Muon's per-block factor alone, before a
    # parameter whose blocks are not its own matrix moved at Muon's per-shape RMS; parameter_rms=False keeps them
    "symo_defaults_gpt_true": {"kind": "symo", "spec": "gpt_true",
                               "options": {"update_scale": "muon", "parameter_rms": False},
                               "grid": [0.01, 0.02, 0.04], "label": "Symo defaults, gpt_true"},
    **{f"symo_{kind}_{spec}": {"kind": "symo", "spec": spec, "grid": grid,
                              "options": {**options, **({"parameter_rms": False} if spec == "gpt_true" and
                                                         options["preset"] == "then_orthogonalize" else {})},
                              "label": f"Symo {LABELS.get(kind, kind)}, {spec}"}
       for kind, options, grid in (
           # the published step with H_inv refreshed every 10 steps (every step costs 5-20x Muon's step here)
           ("published", {"preset": "published", "precondition_frequency": 10}, [0.015, 0.03, 0.06]),
           # eigen_adam as it was before SOAP's conventions became its defaults (these runs are in the caches)
           ("eigen_adam", {"preset": "eigen_adam", **OLDER_EIGEN_ADAM}, [1.5e-3, 3e-3, 6e-3]),
           # eigen_adam now: one-sided SOAP (the side the group leaves free) with SOAP's conventions
           ("one_sided_soap", {"preset": "eigen_adam"}, [1.5e-3, 3e-3, 6e-3]),
           ("then_orthogonalize", {"preset": "then_orthogonalize"}, [0.01, 0.02, 0.04]),
           ("soap", {"preset": "soap"}, [1.5e-3, 3e-3, 6e-3]),
           ("soap_muon", SOAP_MUON, [0.01, 0.02, 0.04]))
       for spec in ("gpt_true", "gpt_muon")},
    # the same SOAP with heavyball's conventions (betas (0.9, 0.95), refresh every 2): the heavyball arm's
    # algorithm inside Symo, so that the gap between the two SOAP arms can be read as conventions or not
    "symo_soap_heavyball_gpt_muon": {"kind": "symo", "spec": "gpt_muon", "options": {"preset": "soap_heavyball"},
                                     "grid": [1.5e-3, 3e-3, 6e-3], "label": "Symo soap_heavyball, gpt_muon"},
    # SOAP-Muon on gpt_muon_qkv: c_attn's query, key and value rows as three matrices, each with its own polar factor
    # and two Kronecker sides (benchmarks/soap_gap.py's qkv study found it ahead of gpt_muon on six seeds at
    # SOAP-Muon's tuned settings; here it is tuned as every arm is)
    "symo_soap_muon_gpt_muon_qkv": {"kind": "symo", "spec": "gpt_muon_qkv", "options": SOAP_MUON,
                                    "grid": [0.01, 0.02, 0.04], "label": "Symo SOAP-Muon, gpt_muon_qkv"},
    # SOAP-Muon with each MLP's c_fc and c_proj as one block through their hidden units (gpt_muon_qkv_mlp: the
    # coupling the MLP's true symmetry makes, with gpt_muon_qkv's attention): whether the coupling that gpt_true
    # adds to the MLP helps SOAP-Muon, apart from gpt_true's per-head attention gauges; each matrix keeps Muon's
    # per-shape RMS (parameter_rms), so the coupling changes the update's direction, not its size
    "symo_soap_muon_gpt_muon_qkv_mlp": {"kind": "symo", "spec": "gpt_muon_qkv_mlp", "options": SOAP_MUON,
                                        "grid": [0.01, 0.02, 0.04],
                                        "label": "Symo SOAP-Muon, gpt_muon_qkv_mlp (MLP one block)"},
    # Muon's step on gpt_muon_qkv (q, k and v three polar factors, as Muon in the public speed records splits them):
    # the baseline's own step with the split, tuned as every arm is, so that what SOAP-Muon gains on gpt_muon_qkv
    # can be told apart from what the split gives any polar step
    "symo_defaults_gpt_muon_qkv": {"kind": "symo", "spec": "gpt_muon_qkv", "options": {"update_scale": "muon"},
                                   "grid": [0.01, 0.02, 0.04], "label": "Symo defaults (Muon's step), gpt_muon_qkv"},
    # SOAP-Muon whose inner SOAP refreshes as heavyball's does (every 2 steps, one step earlier, eps as a clamp,
    # QR with heavyball's shift): benchmarks/soap_gap.py found these worth 0.019 to `soap` at 0.26x Chinchilla
    "symo_soap_muon_heavyball_gpt_muon": {
        "kind": "symo", "spec": "gpt_muon", "grid": [0.01, 0.02, 0.04],
        "options": {**SOAP_MUON, "precondition_frequency": 2, "refresh_phase": "heavyball", "eps_placement": "clamp",
                    "refresh": PowerQR(lift=1e-8)},
        "label": "Symo SOAP-Muon (heavyball's refresh), gpt_muon"},
}



# ------------------------------------------------------------------ one run (in a worker process)
def build(arm: dict, model: Any, lr: float, wd: float, adamw_lr: float, n_embd: int, n_head: int) -> Any:
    """The arm's optimizer for `model` (a symo.train GPT)."""
    import torch

    from symo.train.muon import Muon, is_hidden_matrix

    named = list(model.named_parameters())
    if arm["kind"] == "adamw":
        return torch.optim.AdamW([p for _, p in named], lr=lr, betas=(0.9, 0.95), weight_decay=wd)
    if arm["kind"] == "muon":
        return Muon(named, lr=lr, weight_decay=wd, adamw_lr=adamw_lr)
    if arm["kind"] == "pytorch_optimizer":
        import pytorch_optimizer  # the baseline library, a benchmark dependency (the bench extra)

        hidden = [p for n, p in named if is_hidden_matrix(n, p)]
        rest = [p for n, p in named if not is_hidden_matrix(n, p)]
        cls = getattr(pytorch_optimizer, arm["class"])
        if arm.get("newton_schulz_float32"):
            newton_schulz_in_float32(cls)
        groups = [{"params": hidden, **arm.get("group", {})}]  # NorMuon asks each group whether it is Muon's
        return Chained(cls(groups, lr=lr, weight_decay=wd),
                       torch.optim.AdamW(rest, lr=adamw_lr, betas=(0.9, 0.95), weight_decay=0.0))
    if arm["kind"] == "heavyball":
        import heavyball  # the baseline library, a benchmark dependency (the bench extra)
        import heavyball.utils

        heavyball.utils.compile_mode = None
        hidden = [p for n, p in named if is_hidden_matrix(n, p)]
        rest = [p for n, p in named if not is_hidden_matrix(n, p)]
        return Chained(getattr(heavyball, arm["class"])(hidden, lr=lr, weight_decay=wd),
                       torch.optim.AdamW(rest, lr=adamw_lr, betas=(0.9, 0.95), weight_decay=0.0))
    import symo
    from symo.train.optimizers import head_basis_sizes

    spec = symo.load_spec(arm["spec"])
    sizes = head_basis_sizes(spec, n_embd // n_head)
    return symo.Symo(named, spec, lr=lr, sizes=sizes, weight_decay=wd, adamw_lr=adamw_lr, **arm.get("options", {}))


def newton_schulz_in_float32(cls: type) -> None:
    """Run the quintic Newton-Schulz iteration of a pytorch-optimizer Muon variant in float32 (the library fixes
    bfloat16, which a CPU without bfloat16 units emulates): the iteration each module of the class's bases calls."""
    import functools
    import sys

    import torch

    for module in {sys.modules[c.__module__] for c in cls.__mro__}:
        iteration = getattr(module, "zero_power_via_newton_schulz_5", None)
        if iteration is not None and not isinstance(iteration, functools.partial):
            module.zero_power_via_newton_schulz_5 = functools.partial(iteration, dtype=torch.float32)


class Chained:
    """Two torch optimizers stepped as one (a baseline on the hidden matrices, AdamW on the rest): one list
    of param groups, so the training loop's schedule scales both."""

    def __init__(self, *optimizers: Any) -> None:
        self.optimizers = optimizers
        self.param_groups = [g for o in optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        for o, s in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(s)


def perturb(model: Any, relative: float, seed: int) -> None:
    """Multiply every weight by (1 + relative * N(0, 1)), from a generator of its own (the run's batches and
    initialization are unchanged apart from this)."""
    import torch

    gen = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + relative * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def run_one(job: dict) -> dict:
    """One training run (1 thread) of the arm named `job["arm"]`, or of `job["arm_config"]` where the job carries its
    own (a diagnostic variant that is not a campaign arm, benchmarks/soap_gap.py)."""
    import torch

    torch.set_num_threads(1)
    from symo.train import TrainConfig, train

    setup, arm = job["setup"], job.get("arm_config") or ARMS[job["arm"]]
    out_dir = Path(tempfile.mkdtemp(prefix="nanogpt_matrix_run_"))
    cfg = TrainConfig(optimizer="adamw", lr=job["lr"], seed=job["seed"], progress=False, sample_chars=0,
                      out_dir=str(out_dir), **{k: setup[k] for k in ("steps", "batch_size", "block_size", "n_layer",
                                                                      "n_head", "n_embd", "eval_interval",
                                                                      "eval_batches", "warmup")})
    def factory(model: Any) -> Any:
        if job.get("init_perturbation"):  # the run-to-run floor (benchmarks/soap_seeds.py): same seed, weights
            perturb(model, job["init_perturbation"], job["seed"])  # moved by float32-rounding-sized noise
        return build(arm, model, job["lr"], job["wd"], setup["adamw_lr"], setup["n_embd"], setup["n_head"])

    t = time.perf_counter()
    res = train(cfg, optimizer_factory=factory)
    h = res["history"]
    evals = [(int(s), v) for s, v in zip(h["step"], h["val_loss"]) if not math.isnan(v)]
    import shutil

    shutil.rmtree(out_dir, ignore_errors=True)
    return {"arm": job["arm"], "regime": job["regime"], "lr": job["lr"], "wd": job["wd"], "seed": job["seed"],
            "final_val": res["final_val"], "evals": evals, "ms_per_step_in_run": res["ms_per_step"],
            "wall_s": time.perf_counter() - t}


def follow_up_args(description: str, argv: list[str] | None) -> argparse.Namespace:
    """The options of a benchmark that adds runs beside the campaign's (benchmarks/soap_gap.py, soap_seeds.py)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--workers", type=int, default=2, help="processes for the missing runs (one thread each)")
    p.add_argument("--report", action="store_true", help="train nothing: report what the run cache holds")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder of the outputs and the run cache")
    return p.parse_args(argv)


def runs_beside_the_campaign(jobs: list[dict], cache: Any, workers: int, train: bool, desc: str) -> dict[str, dict]:
    """{key: record} of the jobs there is a run of: from the campaign's run cache of the job's regime where it
    holds the key, else from `cache` (a harness.RunCache), which first trains the others unless `train` is False."""
    from benchmarks.harness import RunCache, RunPool

    campaigns = {r: RunCache(RESULTS / f"nanogpt_matrix_{r}_runs.json") for r in {job["regime"] for job in jobs}}
    if train:
        pool = RunPool(run_one, cache, workers=workers, desc=desc)
        for job in jobs:
            if job["key"] not in campaigns[job["regime"]]:
                pool.submit(job)
        pool.run()
    found = {job["key"]: campaigns[job["regime"]].get(job["key"]) or cache.get(job["key"]) for job in jobs}
    return {key: record for key, record in found.items() if record is not None}


def records_by_group(todo: dict[str, list[dict]], found: dict[str, dict]) -> dict[str, dict[str, dict[int, dict]]]:
    """{regime: {job group: {seed: record}}} of the jobs (per regime) that `found` holds a run of."""
    records: dict[str, dict[str, dict[int, dict]]] = {regime: {} for regime in todo}
    for regime, jobs in todo.items():
        for job in jobs:
            if job["key"] in found:
                records[regime].setdefault(job["group"], {})[job["seed"]] = found[job["key"]]
    return records


def job_for(regime: str, setup: dict, arm: str, lr: float, wd: float, seed: int) -> dict:
    size = "x".join(str(setup[k]) for k in ("n_layer", "n_embd", "n_head", "batch_size", "block_size", "steps"))
    return {"key": f"{regime}/{size}/{arm}/lr{lr:g}/wd{wd:g}/seed{seed}", "regime": regime, "setup": setup,
            "arm": arm, "lr": lr, "wd": wd, "seed": seed}


# ------------------------------------------------------------------ timing (after training, one process)
def timing(setup: dict, chosen: dict[str, tuple[float, float]], rounds: int = 5, steps: int = 10) -> dict[str, float]:
    """Mean ms per (forward + backward + step) per arm at its chosen (lr, wd): interleaved rounds of 10 steps,
    1 thread. The mean over whole rounds, because the kinds refresh their preconditioners every 10 steps (SOAP
    every 2; PSGD-Kron updates its preconditioner at every step of a run this short) and a median would leave
    the refresh out."""
    import torch

    torch.set_num_threads(1)
    from symo.train.data import load_corpus
    from symo.train.models import GPT, GPTConfig

    corpus = load_corpus(None)
    x, y = corpus.batch("train", 0, setup["batch_size"], setup["block_size"], 0)
    setups = {}
    for arm, (lr, wd) in chosen.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=setup["block_size"], vocab_size=corpus.vocab_size, n_layer=setup["n_layer"],
                              n_head=setup["n_head"], n_embd=setup["n_embd"]))
        setups[arm] = (model, build(ARMS[arm], model, lr, wd, setup["adamw_lr"], setup["n_embd"], setup["n_head"]))
    return interleaved_ms_per_step(setups, x, y, rounds, steps, reduce=statistics.mean)
