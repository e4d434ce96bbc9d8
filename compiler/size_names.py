"""How sizes are named in generated code: after their spaces and the axes they measure.

A space's size is `n_<space>` (n_mlp0, n_head3). An axis, or a part of a fused axis, that no space
covers gets `d_<parameter>_dim<k>` (`_part<j>` for part j of a fused axis), where <parameter> is the
parameter's name with dots as underscores (d_transformer_h_3_mlp_c_fc_weight_dim1). In a family of
identical layers (compiler.templates) the loop's sizes drop the layer: n_mlp for the space, and for
<parameter> the shortest tail of the name that tells the family's parameters apart (d_c_fc_weight_dim1).

Names come from input text only when that text is a plain ASCII identifier (after dots become
underscores); anything else gets a numbered name (n_space4, d_param7_dim0), so no input text but an
identifier's letters reaches the generated code. Names are unique: a clash gets a suffix _2, _3, ...
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_IDENT = re.compile(r"[A-Za-z0-9_]+\Z")
_CAPTURE = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


def unique(base: str, taken: set[str]) -> str:
    """`base`, or `base_2`, `base_3`, ... if taken; the result is added to `taken`."""
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def space_symbol(space: str, taken: set[str]) -> str:
    """n_<space> for a space whose name is an ASCII identifier, a numbered name otherwise."""
    base = f"n_{space}" if _IDENT.match(space) and space.isascii() else f"n_space{len(taken)}"
    return unique(base, taken)


def family_space_symbol(declared: str, taken: set[str]) -> str:
    """The loop's name for a space of a family: its declared name without captures (head{i} -> n_head)."""
    stem = _CAPTURE.sub("", declared).strip("_")
    base = f"n_{stem}" if stem and _IDENT.match(stem) and stem.isascii() else f"n_space{len(taken)}"
    return unique(base, taken)


def parameter_stem(name: str, position: int) -> str:
    """A parameter's whole name as identifier text (transformer_h_3_mlp_c_fc_weight), or param<position>."""
    stem = name.replace(".", "_")
    return stem if _IDENT.match(stem) and stem.isascii() else f"param{position}"


def parameter_stems(names: Sequence[str]) -> list[str]:
    """For each parameter name, the shortest tail of its dotted components that no other name in
    `names` ends with, dots as underscores (`transformer.h.3.mlp.c_fc.weight` -> `h_3_mlp_c_fc_weight`
    among several layers). A tail that starts at a number takes the component before it too."""
    tails = [_tails(name) for name in names]
    counts: dict[str, int] = {}
    for own in tails:
        for tail in own:
            counts[tail] = counts.get(tail, 0) + 1
    stems = []
    for i, own in enumerate(tails):
        k = next((k for k, tail in enumerate(own) if counts[tail] == 1), len(own) - 1)
        if k + 1 < len(own) and own[k].split(".", 1)[0].isdecimal():
            k += 1
        stem = own[k].replace(".", "_")
        stems.append(stem if _IDENT.match(stem) and stem.isascii() else f"param{i}")
    return stems


def _tails(name: str) -> list[str]:
    """The dotted tails of a name, shortest first: a.b.c -> [c, b.c, a.b.c]."""
    out, end = [], len(name)
    while (end := name.rfind(".", 0, end)) >= 0:
        out.append(name[end + 1:])
    out.append(name)
    return out


def free_symbol(stem: str, axis: int, part: int, parts: int, taken: set[str]) -> str:
    """The name of a free size: d_<stem>_dim<axis>, or d_<stem>_dim<axis>_part<part> on an axis fused
    from `parts` segments."""
    return unique(f"d_{stem}_dim{axis}" + (f"_part{part}" if parts > 1 else ""), taken)
