"""The reports of a `CompiledSpec`: the memory its statistics take, and the table of its blocks that
`symo compile` prints. Their terms are explained in docs/theory.md."""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING

from .text import REPORT_WIDTH, compact_names, fit_lines, summarize_names

if TYPE_CHECKING:
    from .compiled import CompiledSpec

TERMS_NOTE = ("terms: label = the block's irreducible pieces nat / std / ind (triv pieces are omitted); "
              "ind(head) x nat(d) = heads permuted as wholes (the piece of a perm or signed_perm head owner: one "
              "statistic for all heads, the per-head statistics averaged over them; docs/specs.md, Example 4); "
              "batch = heads, mult x width = the shape of Y, dim = the irrep dimension d; see docs/theory.md")


def memory(spec: CompiledSpec) -> dict[str, int]:
    """Numbers stored: EMA factors, single-gradient roots, dense P x P, and Shampoo's factors."""
    p = sum(math.prod(s) for s in spec.shapes.values())
    shampoo = sum(sum(n * n for n in s) for s in spec.shapes.values())
    return {
        "params": p,
        "factors": sum(b.batch * b.mult * b.mult for b in spec.blocks),
        "single_gradient": sum(b.batch * b.mult * min(b.mult, b.width) for b in spec.blocks),
        "dense": p * p,
        "shampoo": shampoo,
    }


def describe(spec: CompiledSpec) -> str:
    """A human-readable report of the blocks, memory and uncovered parameters (the CLI prints it);
    lines fit in `REPORT_WIDTH` columns. Its terms are explained in docs/theory.md."""
    lines = [f"spec {spec.name!r}: {len(spec.param_names)} covered parameters, {len(spec.uncovered)} uncovered; "
             f"{len(spec.blocks)} isotypic blocks", f"  file: {spec.spec_file}"]
    label_width = min(max([len(b.name) for b in spec.blocks] + [5]), 40)  # std(res) x ind(head11) x nat(dqk11)
    lines.append(f"  {'block':<5} {'label':<{label_width}} {'batch':>5} {'mult':>6} {'width':>6} {'dim':>7}  "
                 "parameters")
    for b in spec.blocks:
        row = f"  {b.id:<5} {b.name:<{label_width}} {b.batch:>5} {b.mult:>6} {b.width:>6} {b.dim:>7}  "
        params = textwrap.wrap(compact_names(b.params), max(REPORT_WIDTH - len(row), 40),
                               break_on_hyphens=False) or [""]
        lines.append(row + params[0])
        lines += [" " * len(row) + more for more in params[1:]]  # continuation under the column
    coupled = [(sp, ps) for sp, ps in spec.couplings if len(ps) > 1]
    if coupled:
        lines.append(f"coupled by shared spaces ({len(coupled)} group{'s' if len(coupled) != 1 else ''} "
                     "of parameters):")
        lines += [f"  {{{summarize_names(ps)}}} via {', '.join(sp)}" for sp, ps in coupled[:4]]
        if len(coupled) > 4:
            lines.append(f"  ... {len(coupled) - 4} more")
    m = memory(spec)
    lines.append(f"memory (numbers): factors {m['factors']:,} | dense S {m['dense']:,} "
                 f"({m['dense'] / max(m['factors'], 1):,.0f}x more) | Shampoo {m['shampoo']:,} "
                 f"({m['shampoo'] / max(m['factors'], 1):.2f}x Symo's)")
    if spec.uncovered:
        lines.append("uncovered (not curvature-preconditioned): " + summarize_names(spec.uncovered))
    lines.append(TERMS_NOTE)
    lines.append(f"generated code: {spec.source_path or '(memory only)'} [{spec.from_cache}]")
    return fit_lines(lines)
