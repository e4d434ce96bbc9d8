"""Text layout for the reports of the runtime and the tools above it: lines fitted to a width, and lists of
parameter names folded into a short form (transformer.h.{0..11}.ln_1.weight)."""

from __future__ import annotations

import textwrap

REPORT_WIDTH = 120


def fit_lines(lines: list[str], width: int = REPORT_WIDTH) -> str:
    """Join report lines, wrapping any longer than `width` columns onto indented continuation lines."""
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False) or [line[:width]]
    return "\n".join(out)


def compact_names(names) -> str:
    """Names sharing all but their last component folded: transformer.h.0.attn.c_attn.{weight, bias}."""
    groups: dict[str, list[str]] = {}
    for name in names:
        head, _, last = name.rpartition(".")
        groups.setdefault(head, []).append(last)
    return ", ".join(f"{head}.{parts[0]}" if len(parts) == 1 and head else parts[0] if len(parts) == 1
                     else f"{head}.{{{', '.join(parts)}}}" if head else ", ".join(parts)
                     for head, parts in groups.items())


def summarize_names(names) -> str:
    """Parameter names with numeric components folded: transformer.h.{0..11}.ln_1.weight."""
    groups: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        digits = [i for i, p in enumerate(parts) if p.isdecimal()]  # "1²" is a digit but no int
        if len(digits) != 1:
            groups.setdefault(name, [])
            continue
        i = digits[0]
        groups.setdefault(".".join(parts[:i] + ["{}"] + parts[i + 1:]), []).append(parts[i])
    out = []
    for pattern, indices in groups.items():
        if not indices:
            out.append(pattern)
        elif len(indices) == 1:
            out.append(pattern.replace("{}", indices[0]))
        else:
            nums = sorted(map(int, indices))
            span = f"{nums[0]}..{nums[-1]}" if nums == list(range(nums[0], nums[-1] + 1)) else ",".join(map(str, nums))
            out.append(pattern.replace("{}", "{" + span + "}"))
    return ", ".join(out)
