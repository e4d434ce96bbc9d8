"""Per-parameter update RMS under Muon's scale, so that one learning rate serves every spec of a model.

Muon's scale (`update_scale="muon"`) is a per-block factor, sqrt(max(1, width / mult)): on a block that is one
weight matrix (rows x cols, a Muon-style spec) it gives the polar factor's update an RMS of 1 / sqrt(cols) per
entry, whatever the matrix's shape. A true-symmetry spec groups coordinates differently: a hidden layer's
permutation puts a matrix whose rows and columns are both permuted into one block of mult 1 and width
rows x cols (a normalised gradient of RMS 1 per entry, sqrt(cols) times Muon's), and puts a layer's rows,
its bias and the next layer's columns into one block, whose polar factor splits its norm between them by the
data. The same rate then moves the parameters by different amounts under different specs (on a small tanh
MLP the true spec's best Muon rate was 1/3 to 1/9 of the Muon-style spec's).

Muon's factor gives a full-rank block an RMS of 1 / sqrt(mult) per entry. The fix, as Moonlight matches AdamW's
RMS: a parameter whose blocks are not its own rows x cols (or its heads' rows x cols: mult = fan_in) has its
update rescaled to the RMS Muon gives a full-rank matrix of its shape, 1 / sqrt(fan_in) with fan_in =
numel / rows (a 1-D parameter counts as one row, fan_in = its length). The other parameters keep Muon's
update exactly, so Muon-style specs are unchanged. `rms_targets` decides this once from the plan;
`match_rms` applies it to the directions, on the rank that owns the parameter's blocks.
"""

from __future__ import annotations

import math

import torch

from ..runtime.compiled import CompiledSpec


def fan_in(shape: tuple[int, ...]) -> int:
    """Entries per row: numel / rows, a 1-D parameter being one row (its length); at least 1."""
    if len(shape) == 0:
        return 1
    if len(shape) == 1:
        return max(1, shape[0])
    return max(1, math.prod(shape[1:]))


def has_muon_rms(compiled: CompiledSpec, name: str) -> bool:
    """Whether Muon's per-block factor already gives `name` Muon's RMS: every block holding it holds it alone,
    with one statistic row per entry of a row (mult = fan_in: its own rows x cols, or its heads' rows x cols)."""
    return all(b.params == (name,) and b.mult == fan_in(compiled.shapes[name])
               for b in compiled.blocks if name in b.params)


def rms_targets(compiled: CompiledSpec) -> dict[str, float]:
    """{parameter: the RMS its update is rescaled to} for the parameters whose blocks are not their own rows x
    cols; the others keep the kind's update as it is. `compiled` is the first spec (a geometric mean's second
    spec carries no scale of its own)."""
    return {n: 1.0 / math.sqrt(fan_in(compiled.shapes[n])) for n in compiled.param_names
            if not has_muon_rms(compiled, n)}


def match_rms(directions: dict[str, torch.Tensor], targets: dict[str, float]) -> dict[str, torch.Tensor]:
    """`directions` with each parameter in `targets` rescaled to its target RMS."""
    if not targets:
        return directions
    out = dict(directions)
    for name, target in targets.items():
        z = out.get(name)
        if z is None:
            continue
        rms = (z if z.dtype == torch.float64 else z.float()).norm() / math.sqrt(max(1, z.numel()))
        scale = torch.where(rms > 0, target / rms, torch.zeros_like(rms))  # a zero direction stays zero
        out[name] = z * scale.to(z.dtype)
    return out


__all__ = ["fan_in", "has_muon_rms", "match_rms", "rms_targets"]
