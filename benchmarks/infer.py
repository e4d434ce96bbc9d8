"""Spec inference: time and coverage of `symo.infer` on the model zoo, GPT-2 124M and ResNet-18.

    python -m benchmarks.infer            # all models; writes benchmarks/results/infer.{md,json}
    python -m benchmarks.infer --quick    # the small models only

Each model runs in its own worker process (one torch thread, fresh memory per model). The pool has
one worker by default: two GPT-2 124M runs side by side fight for memory bandwidth on 2 cores and
each takes ~1.5x longer (`--workers 2` to see it).
`seconds` is the whole `symo.infer` call: the traced forward pass, the layout, the float64 verification
(one random element of the whole group per trial, 2 trials) and the spec. The baseline, measured in the
same process, is one float32 forward pass of the model at the same inputs; the ratio infer / forward is
what stays comparable when the machine is loaded.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "mlp_tanh": "zoo MLP 8-16-16-4, tanh",
    "mlp_relu": "zoo MLP 8-16-16-4, ReLU",
    "gpt_small": "zoo GPT, 4 layers, d_model 128 (nanoGPT layout)",
    "gpt2_124m_nanogpt": "zoo GPT at GPT-2 124M shapes (nanoGPT layout, nn.Linear (out, in))",
    "gpt2_124m_hf": "Hugging Face GPT2LMHeadModel, GPT2Config() defaults: 12 layers, d_model 768 (Conv1D (in, out))",
    "resnet18": "ResNet-18, torchvision layout (symo.train.models_resnet), 3x32x32 inputs, batch 2",
}
QUICK = ("mlp_tanh", "mlp_relu", "gpt_small")


def build(name: str):
    import torch

    import symo
    from symo.train.models_resnet import resnet18

    torch.manual_seed(0)
    if name == "mlp_tanh":
        return symo.models.mlp_tanh()
    if name == "mlp_relu":
        return symo.models.mlp_relu()
    if name == "gpt_small":
        return symo.models.gpt_small()
    if name == "gpt2_124m_nanogpt":
        return symo.models.gpt2_124m()
    if name == "gpt2_124m_hf":
        import transformers

        transformers.logging.set_verbosity_error()
        return transformers.GPT2LMHeadModel(transformers.GPT2Config())
    if name == "resnet18":
        return resnet18()
    raise KeyError(name)


def run_one(name: str) -> dict:
    import torch

    torch.set_num_threads(1)
    from symo.infer import default_example_inputs, infer

    model = build(name)
    args, kwargs = default_example_inputs(model)
    with torch.no_grad():
        model(*args, **kwargs)  # warm-up: first-call costs belong to neither side
        t = time.perf_counter()
        model(*args, **kwargs)
        forward = time.perf_counter() - t
    t = time.perf_counter()
    infer(model, (args, kwargs), verify=False)  # the trace and the spec alone
    unverified = time.perf_counter() - t
    t = time.perf_counter()
    result = infer(model, (args, kwargs))
    seconds = time.perf_counter() - t
    return {
        "model": name,
        "seconds": seconds,
        "covered_params": result.covered_params,
        "total_params": result.total_params,
        "spaces": len(result.spaces),
        "true_spaces": result.true_spaces,
        "identity_spaces": sum(s.status == "identity" for s in result.spaces),
        "trace_seconds": result.seconds.get("trace"),
        "spec_only_seconds": unverified,
        "verify_seconds": result.seconds.get("verify"),
        "forward_seconds": forward,
        "forward_passes": result.forwards,
        "joint_rel_change": result.joint_rel_change,
        "uncovered": list(result.uncovered),
        "spec_lines": len(result.spec.to_toml().splitlines()),
        "groups": sorted({f"{s.group}{' per head' if s.per else ''}" for s in result.spaces}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models only")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    names = list(QUICK if args.quick else MODELS)
    from symo.train.progress import progress as tqdm

    ctx = mp.get_context("spawn")
    rows = {}
    with ctx.Pool(args.workers, maxtasksperchild=1) as pool:
        for row in tqdm(pool.imap_unordered(run_one, names), total=len(names), desc="infer"):
            rows[row["model"]] = row
    rows = {n: rows[n] for n in names}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "infer.json").write_text(json.dumps(rows, indent=2) + "\n")
    import torch

    cmd = "python -m benchmarks.infer" + (" --quick" if args.quick else "") + \
        (f" --workers {args.workers}" if args.workers != 1 else "")
    lines = [f"Command: `{cmd}`", "",
             f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores; a pool of {args.workers} "
             "worker processes, 1 torch thread each; load average at the end: "
             f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (the machine is shared)", "",
             "| model | seconds | trace | verify | spec only (no check) | forward (f32) | infer / forward "
             "| covered params | total params | spaces | true spaces | identity (head owners) | spec lines | groups |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, r in rows.items():
        lines.append(f"| {n} | {r['seconds']:.2f} | {r['trace_seconds']:.2f} | {r['verify_seconds'] or 0:.2f} | "
                     f"{r['spec_only_seconds']:.2f} | "
                     f"{r['forward_seconds']:.3f} | {r['seconds'] / r['forward_seconds']:.0f}x | "
                     f"{r['covered_params']:,} | {r['total_params']:,} | {r['spaces']} | {r['true_spaces']} | "
                     f"{r['identity_spaces']} | {r['spec_lines']} | {', '.join(r['groups'])} |")
    lines += ["", "Models:"] + [f"- `{n}`: {MODELS[n]}" for n in rows]
    lines += ["", "Target: under 5 s for GPT-2 124M and ResNet-18 on 2 cores. `true spaces` counts spaces whose "
              "group passed the float64 output check (identity owners carry no group and are not counted). "
              "Uncovered parameters: " + "; ".join(f"{n}: {', '.join(r['uncovered']) or 'none'}"
                                                    for n, r in rows.items())]
    (out / "infer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
