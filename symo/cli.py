"""Command line: `symo compile SPEC --model module:factory` (or `--shapes ...`); `symo train` (symo/train.py).

Prints the isotypic blocks (labels, multiplicities, irrep dimensions), factor memory against dense
and against Shampoo, the uncovered parameters, and where the generated code lives.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from pathlib import Path

from .compiler import SpecError


def _load_factory(text: str):
    module, _, attr = text.partition(":")
    if not attr:
        raise SystemExit(f"--model expects module:factory (e.g. symo.models:gpt_small), got {text!r}")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"--model {text!r}: {exc}") from exc
    return factory()


def _parse_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """`name=16x8,other=16` or a path to a JSON file {name: [16, 8]}."""
    if Path(text).is_file():
        return {k: tuple(v) for k, v in json.loads(Path(text).read_text()).items()}
    shapes = {}
    for item in filter(None, text.split(",")):
        name, sep, dims = item.partition("=")
        try:
            if not sep:
                raise ValueError
            shapes[name.strip()] = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes: cannot read {item!r}; write name=16x8,other=16 or a JSON file") from None
    return shapes


def _parse_sizes(items: list[str]) -> dict[str, int]:
    sizes = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise SystemExit(f"--size expects space=N (e.g. head{{i}}=4), got {item!r}")
        sizes[name] = int(value)
    return sizes


def _add_train_parser(sub) -> None:
    """`symo train`: every TrainConfig field as a --flag (symo/train.py)."""
    from .train import DEFAULT_LR, OPTIMIZERS, TrainConfig

    t = sub.add_parser("train", help="train a small GPT on Shakespeare (or --data FILE) with Symo, Muon or AdamW",
                       description="Train a nanoGPT-shaped character model. Under torchrun it runs with DDP.")
    helps = {
        "data": "UTF-8 text file (default: the bundled Shakespeare plays)",
        "out_dir": "run folder for log.csv, loss.png, ckpt.pt (default runs/<data>-<optimizer>-<time>)",
        "optimizer": f"one of {', '.join(OPTIMIZERS)}",
        "spec": "Symo's spec: bundled name (gpt_muon, gpt_true, gpt) or a .toml path",
        "lr": f"learning rate of the hidden matrices (AdamW: of all parameters); default {DEFAULT_LR}",
        "adamw_lr": "Symo / Muon: AdamW rate for embeddings, LayerNorm gains and biases",
        "warmup": "linear warm-up steps (then cosine decay to --min-lr-ratio x lr)",
        "batch_size": "global batch (divided among processes)",
        "eval_interval": "steps between validation losses (and checkpoints)",
        "device": "cpu or cuda",
        "compile": "torch.compile the model",
        "resume": "continue the run in --out-dir from its ckpt.pt (same settings), bit-identically",
        "cache_dir": "encoded-corpus cache folder (default: platform cache, or $SYMO_DATA_CACHE)",
        "sample_chars": "characters sampled at the end (0: none)",
        "threads": "torch CPU threads per process",
    }
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "bias":
            t.add_argument("--no-bias", dest="bias", action="store_false", help="no biases in Linear / LayerNorm")
        elif f.name == "progress":
            t.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
        elif f.type in ("bool", bool):
            t.add_argument(flag, action="store_true", help=helps.get(f.name))
        else:
            kind = {"int": int, "float": float}.get(str(f.type).removesuffix(" | None"), str)
            t.add_argument(flag, type=kind, default=f.default, help=helps.get(f.name, "(default %(default)s)"),
                           choices=OPTIMIZERS if f.name == "optimizer" else None)
    t.set_defaults(handler=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from .checkpoint import CheckpointError
    from .data import DataError
    from .train import TrainConfig, train

    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
    try:
        result = train(TrainConfig(**options))
    except (CheckpointError, DataError, SpecError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if dist.is_initialized():  # under torchrun
            dist.destroy_process_group()
    if result.get("sample") is not None and args.progress:
        h = result["history"]
        train_loss = next((v for v in reversed(h["train_loss"]) if v == v), float("nan"))
        print(f"\nstep {result['steps']}: val loss {result['final_val']:.4f} (train {train_loss:.4f}), "
              f"{h['elapsed_s'][-1]:.0f} s, {result['ms_per_step']:.0f} ms/step")
        if result["sample"]:
            print("\n--- sample ---\n" + result["sample"].strip() + "\n--------------")
        print(f"loss plot: {result.get('plot') or '(matplotlib missing)'}")
        print(f"log: {result['run_dir'] / 'log.csv'}   checkpoint: {result['run_dir'] / 'ckpt.pt'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="symo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)
    c = sub.add_parser("compile", help="compile a spec and print its structure")
    c.add_argument("spec", help="path to a .toml spec file")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="module:factory returning an nn.Module, e.g. symo.models:gpt_small")
    src.add_argument("--shapes", help="name=16x8,other=16 or a JSON file {name: shape}")
    c.add_argument("--size", action="append", default=[], help="space size the shapes leave open, e.g. head{i}=4")
    c.add_argument("--no-disk-cache", action="store_true", help="compile in memory only")
    c.add_argument("--source", action="store_true", help="also print the generated code")
    c.add_argument("--optimizer", action="store_true",
                   help="also report the Symo optimizer it builds (default options; needs --model)")
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is not None:
        return args.handler(args)

    import symo

    target = _load_factory(args.model) if args.model else _parse_shapes(args.shapes)
    try:
        compiled = symo.compile(args.spec, target, sizes=_parse_sizes(args.size) or None,
                                disk_cache=not args.no_disk_cache)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(compiled.describe())
    if args.source:
        print(compiled.source)
    if args.optimizer:
        if not args.model:
            print("error: --optimizer needs --model (the optimizer needs parameters)", file=sys.stderr)
            return 2
        opt = symo.Symo(target.named_parameters(), compiled)
        print()
        print(opt.describe())
        m = opt.memory_report()
        print(f"optimizer state (numbers): Symo {m['symo']:,} (block statistics {m['symo_block_statistics']:,}) | "
              f"AdamW {m['adamw']:,} ({m['symo'] / m['adamw']:.2f}x of AdamW) | "
              f"Shampoo factors + AdamW {m['shampoo']:,} ({m['symo'] / max(m['shampoo'], 1):.2f}x of Shampoo)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
