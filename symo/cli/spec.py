"""The spec commands: `symo compile SPEC --model module:factory` (or `--shapes ...`), `symo params`,
`symo check`, `symo infer` (their arguments: parsers.py).

`compile` prints the isotypic blocks (labels, multiplicities, irrep dimensions), factor memory against
dense and against Shampoo, the uncovered parameters, and where the generated code lives. This module
imports torch, sympy and networkx (through the rooms it uses); `main` imports it only to run a command.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from ..compiler import SpecError, load_spec, shapes_of
from ..infer import check_spec, infer
from ..optim import Symo
from ..runtime.compiled import compile
from ..runtime.text import fit_lines
from .common import _load_factory, _parse_shapes, _parse_sizes

__all__ = ["check_command", "compile_command", "infer_command", "infer_command_line", "params_command"]


def compile_command(args: argparse.Namespace) -> int:
    """`symo compile SPEC --model m:f | --shapes ...`: the compile report (and the optimizer's, --optimizer)."""

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


def params_command(args: argparse.Namespace) -> int:
    """`symo params --model m:f | --shapes ...`: the parameter names and shapes a spec's [params] match."""

    shapes = shapes_of(_load_factory(args.model) if args.model else _parse_shapes(args.shapes))
    width = min(max([len(n) for n in shapes] + [4]), 80)
    total = sum(math.prod(s) for s in shapes.values())
    print(f"{len(shapes)} parameters, {total:,} numbers (names as a spec's [params] keys match them)")
    print(f"  {'name':<{width}}  shape")
    for name, shape in shapes.items():
        print(f"  {name:<{width}}  ({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})")
    return 0


def check_command(args: argparse.Namespace) -> int:
    """`symo check SPEC --model m:f`: one line per space, true or relaxed, with the measured change."""

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


def infer_command_line(args: argparse.Namespace) -> str:
    """The `symo infer` command that `args` came from, every option that changes the spec or the report in it,
    so the header of a written spec says how to make it again."""

    words = ["symo", "infer", "--model", args.model]
    if args.heads is not None:
        words += ["--heads", str(args.heads)]
    if args.relax:
        words += ["--relax", args.relax]
    if args.no_verify:
        words.append("--no-verify")
    if args.each:
        words.append("--each")
    if args.output:
        words += ["-o", args.output]
    return shlex.join(words)


def infer_command(args: argparse.Namespace) -> int:
    """`symo infer --model m:f [-o spec.toml]`: the spec, the verification report and the compile report."""

    model = _load_factory(args.model)
    result = infer(model, heads=args.heads, relax=args.relax, verify=not args.no_verify, each=args.each)
    report = result.report()
    print(report)
    text = result.spec.to_toml(header=f"inferred by: {infer_command_line(args)}\n" + report)
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

