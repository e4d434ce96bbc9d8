"""The spec `Symo(model)` picks from the module, and the warning about blocks that share one small statistic.

**The pick.** Given an `nn.Module` and no spec, the optimizer uses the Muon-style relaxation of the inferred
spec (`symo.infer.training_spec`, what `symo infer --relax muon` writes): every hidden weight matrix gets a
private signed_perm row space, and embeddings, the classifier, the first layer and 1-D parameters go to AdamW.
It trains best in our measurements; the true symmetry group of a transformer does not (docs/infer.md,
"Which spec for what"). Inference lives in `symo.infer` (room 3, above the optimizer's room 2): it is loaded
by name, only when a module comes without a spec, so the optimizer never imports it at its top level and the
inference package never imports the optimizer.

**The warning.** A block's statistic is mult x mult, shared by its `width` coordinates (docs/theory.md).
A kind that maps a block by a function of that statistic (polar, root, taylor, published, then_orthogonalize)
tells at most `mult` directions apart per batch element, whatever the width. With mult <= `SMALL_MULT` (4)
and width >= `WIDE` (1024, so at least 256 coordinates per statistic row) its step whitens the block's
gradient by a <= 4 x 4 matrix: close to normalised SGD. Such a block matters when it holds most of a
parameter, so the optimizer warns when these blocks hold at least `MOST` (half) of some parameter's entries
(`narrow_shares` counts them from the blocks' shapes and never overstates). A space that acts on many
parameters through one axis each (a transformer's residual stream) does this to every matrix it touches.
Muon's blocks have one statistic row per matrix column, so a Muon-style spec warns only on a matrix with at
most 4 columns and at least 1024 rows. eigen_adam keeps a second moment per entry, so a small statistic
does not reduce it to a normalised gradient: it is not warned about.
"""

from __future__ import annotations

import importlib
import math
import re
from typing import Any

from torch import nn

from ..compiler import Spec
from ..runtime.compiled import BlockInfo, CompiledSpec
from ..runtime.text import summarize_names

SMALL_MULT = 4
WIDE = 1024
MOST = 0.5
# the kinds whose step on a block is a function of the block's mult x mult statistic (and the block) alone
STATISTIC_KINDS = ("polar", "root", "taylor", "published", "then_orthogonalize")
REASON = ("spec: the Muon-style relaxation inferred from the model (trains best in our measurements; the "
          "true-symmetry spec shares one statistic across many coordinates) — pass spec=... to choose")


def training_spec(model: nn.Module, example_inputs: Any = None) -> Spec:
    """The spec `Symo(model)` uses: `symo.infer.training_spec(model, example_inputs)`, the Muon-style relaxation."""
    infer = importlib.import_module("symo.infer")  # room 3, loaded by name: see the module docstring
    try:
        return infer.training_spec(model, example_inputs)
    except Exception as exc:
        raise RuntimeError(
            f"Symo(model): could not infer a spec from {type(model).__name__} ({type(exc).__name__}: "
            f"{str(exc)[:300]}). Pass example_inputs= (inputs its forward accepts: a tensor, a tuple, a dict or "
            "(args, kwargs)), or pass the spec yourself: Symo(model, spec) with a bundled name such as "
            "'gpt_muon', a path, or the file `symo infer --relax muon` writes") from exc


def reason(compiled: CompiledSpec) -> str:
    """The line `describe()` shows for a spec the optimizer chose itself."""
    if compiled.param_names:
        return REASON
    return REASON + "; this model has no hidden weight matrix, so every parameter goes to AdamW"


def narrow_blocks(compiled: CompiledSpec) -> list[BlockInfo]:
    """Blocks whose statistic is at most SMALL_MULT x SMALL_MULT, shared by at least WIDE coordinates."""
    return [b for b in compiled.blocks if b.mult <= SMALL_MULT and b.width >= WIDE]


def narrow_shares(compiled: CompiledSpec, blocks: list[BlockInfo]) -> dict[str, float]:
    """parameter -> the fraction of its entries inside `blocks`, counted from the blocks' shapes alone.

    A block's Y has `mult` rows, each from one parameter, each row `batch x width` entries. A block with one
    parameter gives it every row; otherwise each of its parameters is counted with one row. That is exact when
    every parameter gives the block one row (a residual stream's blocks, and the blocks of a hidden space's
    bias and mean slices) and an undercount otherwise, so the warning never overstates a share."""
    held: dict[str, int] = {}
    for b in blocks:
        rows = b.mult if len(b.params) == 1 else 1
        for n in b.params:
            held[n] = held.get(n, 0) + b.batch * rows * b.width
    return {n: k / max(math.prod(compiled.shapes[n]), 1) for n, k in held.items()}


def shared_statistic_warning(compiled: CompiledSpec, kind: str) -> str | None:
    """The warning text when narrow blocks hold at least MOST of some parameter's entries (None otherwise)."""
    if kind not in STATISTIC_KINDS:
        return None
    blocks = narrow_blocks(compiled)
    if not blocks:
        return None
    shares = narrow_shares(compiled, blocks)
    hit = {n: s for n, s in shares.items() if s >= MOST}
    if not hit:
        return None
    worst = max(blocks, key=lambda b: (b.batch * b.mult * b.width, -compiled.blocks.index(b)))
    counts: dict[str, int] = {}
    for b in blocks:
        for space in dict.fromkeys(re.findall(r"\(([^()]+)\)", b.name)):
            if space in compiled.spaces:
                counts[space] = counts.get(space, 0) + 1
    advice = (" To train, pass the module itself, symo.Symo(model, ...) (it infers the Muon-style relaxation), or "
              "the spec `symo infer --relax muon` writes; this spec remains the one for the curvature and alignment "
              "tools.")
    cause = ""
    if counts:
        space = max(counts, key=lambda s: (counts[s], len(compiled.space_params.get(s, ()))))
        sp = compiled.spaces[space]
        on = len(compiled.space_params.get(space, ()))
        what = f"{space!r} ({sp['group']}, size {sp['size']}, on {on} parameter{'s' if on != 1 else ''})"
        if counts[space] > 1:
            cause = (f" The space that causes it: {what}, in {counts[space]} of these blocks: a space shared across "
                     "layers (a residual stream) puts each matrix it meets into a block with one statistic row per "
                     "parameter.")
        else:  # one block of its own: a matrix with at most SMALL_MULT statistic rows (columns, for Muon's spaces)
            cause = f" Its space: {what}."
            advice = (" Muon's own step does the same on such a matrix; to give it to AdamW instead, leave it out "
                      "of the spec (its rule's axes '_').")
    least = min(hit.values())
    held = "all" if least >= 0.995 else f"{100 * least:.0f}% or more"
    several = len(blocks) != 1
    return (
        f"spec {compiled.name!r}: {len(blocks)} block{'s share' if several else ' shares'} one small statistic "
        f"across at least {WIDE:,} coordinates, e.g. block {worst.id} {worst.name!r}: Y {worst.batch}x"
        f"{worst.mult}x{worst.width}, one {worst.mult}x{worst.mult} statistic for {worst.width:,} coordinates per "
        f"row (ratio width/mult = {worst.width // worst.mult:,}). {'They hold' if several else 'It holds'} {held} "
        f"of the entries of {len(hit)} parameter{'s' if len(hit) != 1 else ''} ({summarize_names(sorted(hit))}), "
        f"and a step on {'them' if several else 'it'} is close to normalised SGD.{cause}{advice} The rule: a block "
        f"with mult <= {SMALL_MULT} and width >= {WIDE} "
        f"holding at least half of a parameter's entries (symo/optim/auto_spec.py).")


def repeated_space_scale_warning(compiled: CompiledSpec, update_scale: str) -> str | None:
    """The warning for Muon's scale on a spec with a repeated space (one space on two axes of a block, as an
    RNN's W_hh = Q W Q^T): its pieces have frame width n^2, so Muon's per-shape factor is not the step's
    (docs/repeated_spaces.md, "Limits"). None when it does not apply."""
    if update_scale != "muon" or not compiled.repeated_spaces:
        return None
    space, params = next(iter(compiled.repeated_spaces.items()))
    return (f"spec {compiled.name!r}: space {space!r} acts on two axes of {summarize_names(params)} (a repeated "
            "space), and update_scale='muon' sizes steps by a block's frame width, which for its pieces is n^2: "
            "pass update_scale='natural' or 'adamw' with this spec (docs/repeated_spaces.md)")

