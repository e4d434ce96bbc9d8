"""What `symo.align` returns: the moved model, the group element per space, and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..runtime.compiled import CompiledSpec


class AlignError(ValueError):
    """Inputs `symo.align` (or `interpolate`, `repair`, `barrier`) cannot use; the message says what to do."""


class AlignWarning(UserWarning):
    """The spec is not a true symmetry of the model (some spaces are relaxed): the aligned model computes
    a different function there."""


@dataclass(frozen=True)
class SpaceReport:
    """One space: its group, how it was matched, the objective over the parameters it acts on at the
    identity (`before`) and at the element found (`after`), as cosines <W_ref, g W_other> / (|W_ref|
    |W_other|), the last sweep that changed its element (0: none did) and whether that element is the
    identity (`identity`: False for a space that no sweep changed but its start moved, the solo or a
    random start, or activation matching)."""

    name: str
    group: str
    size: int
    per: str | None
    copies: int
    method: str
    before: float
    after: float
    last_changed: int
    identity: bool


@dataclass
class AlignResult:
    """`model`: `other` moved by the group element (a module if `other` was one, else a state dict);
    `elements`: per space, its element: `perm` a LongTensor p with x'_i = x_{p_i}; `signed_perm` a pair
    (p, signs) with x'_i = signs_i x_{p_i}; `orthogonal` a matrix Q with x' = Q x; a `per` space has one
    per index of its owner (a leading axis). `matrices` holds every element as (copies, n, n) matrices,
    ready for `compiled.act`. `seconds`: wall time per stage, in order: "spec" (compiling or inferring it),
    "check" (the symmetry check, when run), "activations" (activation matching, when used), "match" (weight
    matching), "apply" (moving `other`), "total". `converged`: False when the coordinate descent stopped at
    `max_sweeps` while elements still moved (`sweeps` then equals it): a larger `max_sweeps` may find a better
    element."""

    model: Any
    elements: dict[str, Any]
    matrices: dict[str, torch.Tensor]
    compiled: CompiledSpec
    method: str
    spaces: list[SpaceReport]
    objective_before: float
    objective_after: float
    sweeps: int
    start: str
    seconds: dict[str, float]
    relaxed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    converged: bool = True

    def report(self) -> str:
        """Per space: group, method, the objective before and after (cosine over its parameters), the last
        sweep that changed it (else what set its element, or "-": the identity kept); then the totals."""
        width = max([len(s.name) for s in self.spaces] + [5])
        lines = [f"align ({self.method}), spec {self.compiled.name!r}: {len(self.spaces)} spaces matched, "
                 f"{self.sweeps} sweep{'s' if self.sweeps != 1 else ''}"
                 + ("" if self.converged else " (the limit, not converged)")
                 + (f", best run started from {self.start}" if self.start != "identity" else ""),
                 f"  {'space':<{width}}  {'group':<28} {'n':>6} {'method':<11} {'before':>8} {'after':>8}  "
                 "last changed"]
        for s in self.spaces:
            group = s.group + (f" per {s.per} (x{s.copies})" if s.per else "")
            changed = f"sweep {s.last_changed}" if s.last_changed else "-" if s.identity else \
                "activations" if s.method == "activations" else f"{self.start} start"
            lines.append(f"  {s.name:<{width}}  {group:<28} {s.size:>6} {s.method:<11} {s.before:>8.4f} "
                         f"{s.after:>8.4f}  {changed}")
        lines.append(f"objective sum <W_ref, g W_other>: {self.objective_before:.6g} -> {self.objective_after:.6g}")
        if self.relaxed:
            lines.append("not true symmetries of the model (the aligned model computes another function): "
                         + ", ".join(self.relaxed))
        lines += [f"note: {n}" for n in self.notes]
        lines.append("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items()))
        return "\n".join(lines)


def readable_elements(compiled: CompiledSpec, matrices: dict[str, torch.Tensor]) -> dict[str, Any]:
    """{space: (copies, n, n)} -> the per-group forms of `AlignResult.elements` (identity spaces left out)."""
    out: dict[str, Any] = {}
    for s, m in matrices.items():
        info = compiled.spaces[s]
        if info["group"] == "identity":
            continue
        squeeze = info["per"] is None
        if info["group"] == "orthogonal":
            out[s] = m[0] if squeeze else m
            continue
        perm = m.abs().argmax(-1)
        if info["group"] == "perm":
            out[s] = perm[0] if squeeze else perm
        else:
            signs = torch.gather(m, -1, perm.unsqueeze(-1)).squeeze(-1).sign().to(torch.int8)
            out[s] = (perm[0], signs[0]) if squeeze else (perm, signs)
    return out
