"""`symo equivariance` on the command line: train w and A w in lockstep and report whether an optimizer
commutes with a spec's group (symo.gauge.check_equivariance)."""

from __future__ import annotations

import argparse
import math
import sys

import torch

from ..compiler import SpecError
from ..experiments.zoo import RULES, make
from ..gauge import check_equivariance
from ..optim import Symo
from .common import CommandError, _import, _load_factory
from .parsers import BUILTIN_RULES

__all__ = ["equivariance_command"]




def _optimizer_factory(name: str, lr: float | None, spec: str | None = None):
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
        return lambda ps: Symo(ps, spec or "factored", lr=lr or 1e-2)
    if name in RULES:
        return lambda ps: make(name, ps, lr)
    raise CommandError(f"unknown optimizer {name!r}; choose from {', '.join(BUILTIN_RULES)} or give module:factory",
                       2)


def equivariance_command(args: argparse.Namespace) -> int:
    """`symo equivariance OPTIMIZER...`: twin training per optimizer; status 1 if any is not equivariant."""
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise CommandError(f"--lr must be a positive number, got {args.lr:g}", status=2)
    if args.steps < 1:
        raise CommandError(f"--steps must be at least 1, got {args.steps}", status=2)
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise CommandError(f"--tolerance must be a number >= 0, got {args.tolerance:g}", status=2)
    if args.spec and not args.model:
        raise CommandError("--spec is the symmetry of --model: give --model and --loss with it (the default "
                           "problem has its own spec, factored)", status=2)

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
    all_ok, failed = True, False
    for name in args.optimizer:
        try:
            report = check_equivariance(_optimizer_factory(name, args.lr, args.spec), model, args.spec, loss,
                                        steps=args.steps, seed=args.seed, tolerance=args.tolerance)
        except SpecError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except (ValueError, TypeError) as exc:  # this rule cannot take these parameters: say so, check the others
            print(f"{name:>12}: error: {exc}" + (" (a built-in rule takes every parameter: give a module:factory "
                                                 "that routes the 1-D ones to another optimizer)"
                                                 if "1-D" in str(exc) else ""), file=sys.stderr)
            failed = True
            continue
        print(f"{name:>12}: {report.summary()}")
        all_ok &= report.is_equivariant
    return 2 if failed else (0 if all_ok else 1)
