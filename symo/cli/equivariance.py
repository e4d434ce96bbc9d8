"""`symo equivariance` on the command line: train w and A w in lockstep and report whether an optimizer
commutes with a spec's group (symo.gauge.check_equivariance)."""

from __future__ import annotations

import math
import sys

from .common import CommandError, _import, _load_factory

_BUILTIN_RULES = ("sgd", "heavy_ball", "symo", "gd", "adam", "scalar_adam", "rmsprop", "signum", "lion", "adafactor",
                  "muon", "shampoo")


def add_equivariance_parser(sub) -> None:
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
    e.set_defaults(run=_equivariance)


def _optimizer_factory(name: str, lr: float | None):
    # heavy (torch, sympy, networkx): imported when the command runs, not for `symo --help`
    import torch

    from ..experiments.zoo import RULES, make
    from ..optim import Symo

    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            return getattr(_import(module), attr)
        except (ImportError, AttributeError) as exc:
            raise CommandError(f"optimizer {name!r}: {exc}") from exc
    if name == "sgd":
        return lambda ps: torch.optim.SGD(ps, lr=lr or 0.05)
    if name == "heavy_ball":
        return lambda ps: torch.optim.SGD(ps, lr=lr or 0.05, momentum=0.9)
    if name == "symo":
        return lambda ps: Symo(ps, "factored", lr=lr or 1e-2)
    if name in RULES:
        return lambda ps: make(name, ps, lr)
    raise CommandError(f"unknown optimizer {name!r}; choose from {', '.join(_BUILTIN_RULES)} or give module:factory",
                       2)


def _equivariance(args) -> int:
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise CommandError(f"--lr must be a positive number, got {args.lr:g}", status=2)
    # heavy (torch, sympy, networkx): imported when the command runs, not for `symo --help`
    from ..compiler import SpecError
    from ..gauge import check_equivariance

    model = loss = None
    if args.model or args.loss:
        if not (args.model and args.loss and args.spec):
            print("error: --model needs --loss and --spec (the loss must be invariant under the spec's group)",
                  file=sys.stderr)
            return 2
        model = _load_factory(args.model)
        module, _, attr = args.loss.partition(":")
        try:
            loss = getattr(_import(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise CommandError(f"--loss {args.loss!r}: {exc}") from exc
    all_ok = True
    for name in args.optimizer:
        try:
            report = check_equivariance(_optimizer_factory(name, args.lr), model, args.spec, loss,
                                             steps=args.steps, seed=args.seed, tolerance=args.tolerance)
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{name:>12}: {report.summary()}")
        all_ok &= report.is_equivariant
    return 0 if all_ok else 1
