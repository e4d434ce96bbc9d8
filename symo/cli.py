"""Command line: `symo compile SPEC --model module:factory` (or `--shapes ...`).

Prints the isotypic blocks (labels, multiplicities, irrep dimensions), factor memory against dense
and against Shampoo, the uncovered parameters, and where the generated code lives.
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="symo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
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
    _add_equivariance_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "equivariance":
        return _equivariance(args)

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


# ---------------------------------------------------------------------------- symo equivariance
_BUILTIN_RULES = ("sgd", "heavy_ball", "symo", "gd", "adam", "scalar_adam", "rmsprop", "signum", "lion", "adafactor",
                  "muon", "shampoo")


def _add_equivariance_parser(sub) -> None:
    e = sub.add_parser("equivariance", help="does an optimizer commute with a symmetry? (twin training, float64)",
                       description="Train w and A w in lockstep (A a random element of the spec's group) and "
                                   "report ||A w_t - w'_t|| / ||w'_t|| at step 1 and after --steps steps. Exit "
                                   "status 0 if equivariant, 1 if not. Default problem: a small W = U V^T "
                                   "matrix-sensing problem with the O(k) gauge (specs/factored.toml).")
    e.add_argument("optimizer", nargs="+",
                   help=f"one or more of {', '.join(_BUILTIN_RULES)}, or module:factory (factory(named_params) "
                        "returns a torch.optim.Optimizer)")
    e.add_argument("--lr", type=float, default=None, help="learning rate of the built-in rules (default per rule)")
    e.add_argument("--steps", type=int, default=10)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--tolerance", type=float, default=1e-8)
    e.add_argument("--spec", default=None, help="symmetry spec (default: factored, with the default problem)")
    e.add_argument("--model", default=None, help="module:factory returning an nn.Module (needs --loss and --spec)")
    e.add_argument("--loss", default=None, help="module:function, loss(module) -> scalar tensor")


def _optimizer_factory(name: str, lr: float | None):
    import torch

    import symo
    from symo import zoo

    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise SystemExit(f"optimizer {name!r}: {exc}") from exc
    if name == "sgd":
        return lambda ps: torch.optim.SGD(ps, lr=lr or 0.05)
    if name == "heavy_ball":
        return lambda ps: torch.optim.SGD(ps, lr=lr or 0.05, momentum=0.9)
    if name == "symo":
        return lambda ps: symo.Symo(ps, "factored", lr=lr or 1e-2)
    if name in zoo.RULES:
        return lambda ps: zoo.make(name, ps, lr)
    raise SystemExit(f"unknown optimizer {name!r}; choose from {', '.join(_BUILTIN_RULES)} or give module:factory")


def _equivariance(args) -> int:
    import symo

    model = loss = None
    if args.model or args.loss:
        if not (args.model and args.loss and args.spec):
            print("error: --model needs --loss and --spec (the loss must be invariant under the spec's group)",
                  file=sys.stderr)
            return 2
        model = _load_factory(args.model)
        module, _, attr = args.loss.partition(":")
        try:
            loss = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise SystemExit(f"--loss {args.loss!r}: {exc}") from exc
    all_ok = True
    for name in args.optimizer:
        try:
            report = symo.check_equivariance(_optimizer_factory(name, args.lr), model, args.spec, loss,
                                             steps=args.steps, seed=args.seed, tolerance=args.tolerance)
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{name:>12}: {report.summary()}")
        all_ok &= report.is_equivariant
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
