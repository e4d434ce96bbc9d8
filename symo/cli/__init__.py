"""Command line: `symo compile SPEC --model module:factory` (or `--shapes ...`), `symo params`, `symo train`,
`symo check`, `symo infer`, `symo equivariance`.

Prints the isotypic blocks (labels, multiplicities, irrep dimensions), factor memory against dense
and against Shampoo, the uncovered parameters, and where the generated code lives.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from .. import __version__
from .common import CommandError, _describe, _load_factory, _parse_shapes, _parse_sizes, _spec_error
from .equivariance import add_equivariance_parser
from .train import add_train_parser

# Only light modules at import time: `symo --help` must not pay for torch, sympy or networkx. Each
# command imports those when it runs (the imports inside the command functions below).

__all__ = ["CommandError", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run `symo ARGV` (default: sys.argv[1:]); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="symo", description="Symo: symmetry-structured curvature for PyTorch. List a model's parameters "
        "(params), write a spec or let infer write one, compile it and check it against the model (compile, "
        "check), then train with it (train). Each command has its own --help.")
    parser.add_argument("--version", action="version", version=f"symo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    c = sub.add_parser("compile", help="compile a spec and print its structure")
    c.add_argument("spec", help="path to a .toml spec file, or the name of a bundled spec (e.g. gpt_muon)")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="module:factory returning an nn.Module, e.g. symo.train.models:gpt_small")
    src.add_argument("--shapes", help="name=16x8,other=16 or a JSON file {name: shape}")
    c.add_argument("--size", action="append", default=[], help="space size the shapes leave open, e.g. head{i}=4")
    c.add_argument("--no-disk-cache", action="store_true", help="compile in memory only")
    c.add_argument("--source", action="store_true", help="also print the generated code")
    c.add_argument("--optimizer", action="store_true",
                   help="also report the Symo optimizer it builds (default options; needs --model)")
    c.add_argument("--partial", action="store_true",
                   help="the parameters are a subset of those the spec was written for: drop the rules that match "
                        "none (default: such a rule is an error)")
    c.add_argument("--no-check", dest="check", action="store_false",
                   help="with --model: skip the symmetry check (by default each space is checked as `symo check` "
                        "does, and every space that is not a true symmetry is named in a warning)")
    c.set_defaults(run=_compile_command)
    _add_params_command(sub)
    _add_check_parser(sub)
    _add_infer_parser(sub)
    add_equivariance_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
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


def _compile_command(args: argparse.Namespace) -> int:
    # heavy (torch, sympy, networkx): imported when the command runs, not for `symo --help`
    from ..compiler import load_spec
    from ..optim import Symo
    from ..runtime.compiled import compile, fit_lines

    if args.optimizer and not args.model:  # before any output: a usage error prints nothing else
        print("error: --optimizer needs --model (the optimizer needs parameters)", file=sys.stderr)
        return 2
    sizes = _parse_sizes(args.size) or None
    target = _load_factory(args.model) if args.model else _parse_shapes(args.shapes)
    spec = load_spec(args.spec)
    compiled = compile(spec, target, sizes=sizes, disk_cache=not args.no_disk_cache, strict=not args.partial)
    print(compiled.describe())
    if args.source:
        print(compiled.source)
    if args.optimizer:
        opt = Symo(target.named_parameters(), compiled)
        print()
        print(opt.describe())
        m = opt.memory_report()
        print(fit_lines([
            f"optimizer state (numbers): Symo {m['symo']:,} (block statistics {m['symo_block_statistics']:,}) | "
            f"AdamW {m['adamw']:,} ({m['symo'] / m['adamw']:.2f}x of AdamW) | "
            f"Shampoo factors + AdamW {m['shampoo']:,} ({m['symo'] / max(m['shampoo'], 1):.2f}x of Shampoo)"]))
    print()
    if not args.model:
        print(f"symmetry not checked (no model): run `symo check {args.spec} --model module:factory` to see which "
              "spaces are true symmetries")
    elif args.check:
        _warn_relaxed(spec, target, args, sizes)
    return 0


def _warn_relaxed(spec, model, args: argparse.Namespace, sizes: dict[str, int] | None) -> None:
    """`symo compile --model`: the check of `symo check` (symo.check_spec); one warning per space that
    is not a true symmetry of the model, on stderr."""
    # heavy (torch, sympy, networkx): imported when the command runs, not for `symo --help`
    from ..infer import check_spec

    tolerance = 1e-9
    try:
        rows = check_spec(spec, model, sizes=sizes, tolerance=tolerance, strict=not args.partial)
    except Exception as exc:  # the user's model could not run the check: say so, the compile stands
        sys.stdout.flush()
        print(f"warning: symmetry not checked ({type(exc).__name__}: {str(exc)[:300]}); run `symo check "
              f"{args.spec} --model {args.model}` once the model runs on example inputs", file=sys.stderr)
        return
    relaxed = [r for r in rows if r.status == "relaxed"]
    checked = sum(r.status != "identity" for r in rows)
    if not relaxed:
        what = "the space with a group is a true symmetry" if checked == 1 else \
            f"all {checked} spaces with a group are true symmetries"
        print(f"symmetry check: {what} of the model (float64; --no-check skips it)")
        return
    sys.stdout.flush()
    width = max(len(r.space) for r in relaxed)
    verb = "is not a true symmetry" if len(relaxed) == 1 else "are not true symmetries"
    lines = [f"warning: {len(relaxed)} of {checked} space{'s' if checked != 1 else ''} {verb} of the model "
             "(relaxed, the outputs change; fine if intended):"]
    lines += [f"  {r.space:<{width}}  {r.group + (f' per {r.per}' if r.per else ''):<24} size {r.size:>6}  "
              f"relative output change {r.rel_change:.2e}" for r in relaxed]
    lines.append(f"  details: symo check {args.spec} --model {args.model}; --no-check skips this check")
    print("\n".join(lines), file=sys.stderr)


def _add_params_command(sub) -> None:
    p = sub.add_parser("params", help="list a model's parameter names and shapes (what a spec's [params] matches)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="module:factory returning an nn.Module, e.g. symo.train.models:gpt_small")
    src.add_argument("--shapes", help="name=16x8,other=16 or a JSON file {name: shape}")
    p.set_defaults(run=_params_command)


def _params_command(args: argparse.Namespace) -> int:
    # heavy (torch, sympy, networkx): imported when the command runs, not for `symo --help`
    from ..compiler import shapes_of

    shapes = shapes_of(_load_factory(args.model) if args.model else _parse_shapes(args.shapes))
    width = min(max([len(n) for n in shapes] + [4]), 80)
    total = sum(math.prod(s) for s in shapes.values())
    print(f"{len(shapes)} parameters, {total:,} numbers (names as a spec's [params] keys match them)")
    print(f"  {'name':<{width}}  shape")
    for name, shape in shapes.items():
        print(f"  {name:<{width}}  ({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})")
    return 0


def _add_check_parser(sub) -> None:
    c = sub.add_parser("check", help="report each space of a spec as a true or relaxed symmetry of a model")
    c.add_argument("spec", help="path to a .toml spec file, or the name of a bundled spec")
    c.add_argument("--model", required=True, help="module:factory returning an nn.Module")
    c.add_argument("--size", action="append", default=[], help="space size the shapes leave open, e.g. head{i}=4")
    c.add_argument("--trials", type=int, default=2, help="random group elements per space (default 2)")
    c.add_argument("--tolerance", type=float, default=1e-9, help="relative output change counted as zero (float64)")
    c.add_argument("--partial", action="store_true", help="drop the spec's rules that match no parameter")
    c.set_defaults(run=_run_check)


def _run_check(args) -> int:
    """`symo check SPEC --model m:f`: one line per space, true or relaxed, with the measured change."""
    # heavy (torch, sympy, networkx): imported when the command runs, not for `symo --help`
    from ..compiler import SpecError
    from ..infer import check_spec

    model = _load_factory(args.model)
    try:
        rows = check_spec(args.spec, model, sizes=_parse_sizes(args.size) or None, trials=args.trials,
                          tolerance=args.tolerance, strict=not args.partial)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    width = max([len(r.space) for r in rows] + [5])
    print(f"{'space':<{width}}  {'group':<26} {'size':>6}  status    relative output change (float64)")
    for r in rows:
        group = r.group + (f" per {r.per}" if r.per else "")
        change = "-" if r.rel_change is None else f"{r.rel_change:.2e}"
        print(f"{r.space:<{width}}  {group:<26} {r.size:>6}  {r.status:<8}  {change}")
    relaxed = sum(r.status == "relaxed" for r in rows)
    print(f"{len(rows)} space{'s' if len(rows) != 1 else ''}: {sum(r.status == 'true' for r in rows)} true, "
          f"{relaxed} relaxed "
          f"(tolerance {args.tolerance:.0e})")
    return 0


def _add_infer_parser(sub) -> None:
    c = sub.add_parser("infer", help="infer a model's symmetry spec, verify it, and print the compile report")
    c.add_argument("--model", required=True, help="module:factory returning an nn.Module")
    c.add_argument("--heads", type=int, default=None, help="head count where the graph does not show the split")
    c.add_argument("--relax", choices=["muon"], default=None, help="the Muon-style relaxation instead")
    c.add_argument("-o", "--output", default=None, help="write the spec here (default: print it)")
    c.add_argument("--no-verify", action="store_true", help="skip the numeric check (not recommended)")
    c.add_argument("--each", action="store_true", help="measure each family of spaces, not only all at once")
    c.set_defaults(run=_run_infer)


def _run_infer(args) -> int:
    """`symo infer --model m:f [-o spec.toml]`: the spec, the verification report and the compile report."""
    # heavy (torch, sympy, networkx): imported when the command runs, not for `symo --help`
    from ..infer import infer
    from ..runtime.compiled import compile

    model = _load_factory(args.model)
    result = infer(model, heads=args.heads, relax=args.relax, verify=not args.no_verify, each=args.each)
    report = result.report()
    print(report)
    text = result.spec.to_toml(header=f"inferred by: symo infer --model {args.model}\n" + report)
    if args.output:
        path = Path(args.output)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # atomic: a reader never sees half a spec
        print(f"wrote {path}")
    else:
        print()
        print(text)
    print()
    print(compile(result.spec, model).describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
