"""Heads permuted as wholes in weight matching: the objective over a head owner and its per-head spaces, by
pairs of heads (`head_pair_terms`), and the coordinate step that solves them jointly (`update_owner`, with
solve.solve_heads), which a step on the owner alone would miss."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..runtime.compiled import CompiledSpec
from .solve import solve_heads

Tensors = Mapping[str, torch.Tensor]


def head_pair_terms(compiled: CompiledSpec, element: Tensors, s: str, owned: list[str], ref: Tensors,
                    other: Tensors) -> tuple[torch.Tensor, dict[str, torch.Tensor]] | None:
    """The objective over owner `s` and its per-spaces `owned`, the other spaces at `element`, by pairs of heads:
    C0 (n, n), C0[a, b] = <ref's head a, other's head b> over the blocks where no owned space occurs, and per
    owned space t, C_t (n, n, m, m): ref's head a against other's head b contracted over every atom but t's
    (float64). None where two owned spaces share a block (the objective is then not linear per pair)."""
    names = compiled.space_params[s]
    reset = {t: torch.eye(element[t].shape[-1], dtype=element[t].dtype).expand_as(element[t]) for t in [s, *owned]}
    with torch.no_grad():
        moved = compiled.act({**element, **reset}, other, names)
    n = compiled.spaces[s]["size"]
    c0 = torch.zeros(n, n, dtype=torch.float64)
    cross = {t: torch.zeros(n, n, compiled.spaces[t]["size"], compiled.spaces[t]["size"], dtype=torch.float64)
             for t in owned}
    for name in names:
        for block in compiled.param_blocks(name):
            atoms = [sp for axis in block["axes"] for sp, _ in axis]
            if s not in atoms:
                continue
            here = [k for k, sp in enumerate(atoms) if sp in cross]
            if len(here) > 1 or atoms.count(s) > 1:
                return None
            sizes = [size for axis in block["axes"] for _, size in axis]
            r, y = ref[name], moved[name]
            for axis, (start, length) in enumerate(block["slices"]):
                r, y = r.narrow(axis, start, length), y.narrow(axis, start, length)
            r, y = r.reshape(sizes).double().cpu(), y.reshape(sizes).double().cpu()
            j = atoms.index(s)
            if not here:
                c0 += torch.movedim(r, j, 0).reshape(n, -1) @ torch.movedim(y, j, 0).reshape(n, -1).T
                continue
            k = here[0]
            r = torch.movedim(r, (j, k), (0, 1)).reshape(n, sizes[k], -1)
            y = torch.movedim(y, (j, k), (0, 1)).reshape(n, sizes[k], -1)
            cross[atoms[k]] += torch.einsum("aiz,bjz->abij", r, y)
    return c0, cross


def update_owner(compiled: CompiledSpec, element: dict[str, torch.Tensor], s: str, owned: list[str], ref: Tensors,
                  other: Tensors) -> float | None:
    """Owner `s` (perm or signed_perm) and its per-spaces `owned` solved jointly, the other spaces fixed (module
    docstring); returns the gain, or None where the objective does not split by head pairs (two of the owned
    spaces in one block: the caller then solves `s` alone)."""
    terms = head_pair_terms(compiled, element, s, owned, ref, other)
    if terms is None:
        return None
    c0, cross = terms
    groups = {t: compiled.spaces[t]["group"] for t in owned}
    q, rotations, value = solve_heads(compiled.spaces[s]["group"], c0, {t: (groups[t], cross[t]) for t in owned})
    # the current element's value in the same terms: x'_a = R_a sum_b P_ab x_b
    p = element[s][0].double()
    current = float((p * c0).sum()) + sum(
        float((p * torch.einsum("aij,abij->ab", element[t].double(), cross[t])).sum()) for t in owned)
    if not (math.isfinite(value) and value > current + 1e-13 * max(abs(current), 1e-30)):
        return 0.0
    dtype = element[s].dtype
    element[s] = q.to(dtype).unsqueeze(0)
    element.update({t: r.to(dtype) for t, r in rotations.items()})
    return value - current
