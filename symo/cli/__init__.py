"""Room 5, the `symo` command: `symo compile SPEC --model module:factory` (or `--shapes ...`), `symo params`,
`symo train`, `symo check`, `symo infer`, `symo equivariance`, `symo align`, `symo merge`.

- parsers.py: every command's arguments; each names the function that runs it;
- spec.py: compile, params, check, infer; train.py: train (and its terminal output, `ConsoleReport`);
  equivariance.py: equivariance; align.py: align and merge (their arguments: align_args.py);
- common.py: the user-error exception, `--model` / `--shapes` / `--size` parsing, error descriptions.

`main` builds the parser from parsers.py alone and imports a command's module (which imports torch and
the rooms it needs at its top) only when that command runs: `symo --help` and `symo --version` load
neither torch nor sympy nor networkx (benchmarks/startup.py times them).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
import warnings
from typing import NoReturn

from .common import CommandError, _describe, _spec_error
from .parsers import add_commands

__all__ = ["CommandError", "main"]


def _version() -> str:
    """The installed distribution's version (the package root holds the same number as `symo.__version__`;
    a room does not import the root)."""
    try:
        return importlib.metadata.version("symo")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(version unknown: not installed)"


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one `warning: ...` line on stderr, like the errors (no source file and line)."""
    print(f"warning: {message}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with a usage error in one line, `symo train: error: ...; see symo train --help`,
    instead of the whole usage block before it; the subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def main(argv: list[str] | None = None) -> int:
    """Run `symo ARGV` (default: sys.argv[1:]); returns the exit status."""
    parser = _Parser(
        prog="symo", description="Symo: symmetry-structured curvature for PyTorch. List a model's parameters "
        "(params), write a spec or let infer write one, compile it and check it against the model (compile, "
        "check), then train with it (train); align or merge two trained models modulo the group (align, "
        "merge), and test whether an optimizer respects it (equivariance). Each command has its own --help.")
    parser.add_argument("--version", action="version", version=f"symo {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_commands(sub)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own parser says it, naming the command (argparse's top-level parser would not)
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    precheck = getattr(args, "precheck", None)
    if precheck is not None:  # option values, before the command's module (and torch) is imported
        try:
            precheck(args)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    module, _, function = args.run.partition(":")
    try:
        with warnings.catch_warnings():  # restores the default display afterwards (main runs in tests too)
            warnings.showwarning = _show_warning
            run = getattr(importlib.import_module(module, __name__), function)  # the command's module, only now
            return run(args)
    except _spec_error() as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except (SystemExit, KeyboardInterrupt):
        raise
    except BrokenPipeError:  # `symo ... | head`: the reader left; not an error worth a message
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # no traceback for a user: the error and where to look
        print(f"error: {_describe(exc)}", file=sys.stderr)
        return 1
