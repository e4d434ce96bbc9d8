"""The block plan: what Symo decides once, at construction, for every block of its compiled spec(s).

A `Stage` is one compiled spec (two for a geometric mean); each of its blocks gets a `BlockPlan`: its
sizes, its parameters, its matrix function (a config chosen by the kind) and whether its Y is the transpose
of one square weight. Values a schedule may change (the power, the betas, the update scale) are not copied
here: the kinds read them from the optimizer's config at every step. `compile_subset` compiles the spec for the
parameters given (the rules of frozen parameters left out dropped with a warning).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..compiler import SpecError
from ..runtime.compiled import BlockInfo, CompiledSpec, compile_for
from .matrix_function_configs import MatrixFunction


@dataclass(frozen=True)
class BlockPlan:
    """One block's static constants."""

    id: str
    dim: int
    """d, the block's isotypic dimension (at least 1)."""
    batch: int
    mult: int
    width: int
    backend: MatrixFunction
    """The block's matrix function: the kind's `backend` resolved for this block (Auto decided), Eigh() or the
    iteration's config (NewtonSchulz(...), CoupledNewton(...)); `label` names it in `describe()`."""
    params: tuple[str, ...]
    dof: int
    """mult * d: the entries of one batch element's update (its RMS for update_scale="adamw")."""
    where: str
    """How messages name the block."""
    transposed: bool
    """Y is G^T of one square matrix G: Newton–Schulz iterates on G, as Muon does."""
    trivial: bool
    """The all-trivial label: vectors here are invariant under the group (R1 is the identity on them)."""
    first: bool
    """The block belongs to the first stage (the spec the update scale's shape factor refers to)."""


@dataclass
class Stage:
    """One compiled spec's blocks with their plans."""

    compiled: CompiledSpec
    key: str
    """Optimizer-state key of the block states: "symo_blocks" / "symo_gm_blocks"."""
    blocks: dict[str, BlockPlan] = field(default_factory=dict)


def build_stages(specs: list[CompiledSpec], backend_for: Callable[[BlockInfo, int], MatrixFunction]) -> list[Stage]:
    """The plan for `specs` (the spec, and a geometric-mean partner); `backend_for(block, stage)` is the kind's."""
    stages = [Stage(comp, "symo_blocks" if k == 0 else "symo_gm_blocks") for k, comp in enumerate(specs)]
    for k, stage in enumerate(stages):
        transposed = square_transposed_blocks(stage.compiled)
        for b in stage.compiled.blocks:
            stage.blocks[b.id] = BlockPlan(
                b.id, max(b.dim, 1), b.batch, b.mult, b.width, backend_for(b, k), tuple(b.params),
                b.mult * max(b.dim, 1), f"block {b.id} ({b.name})", b.id in transposed, b.name == "trivial",
                k == 0)
    return stages


def square_transposed_blocks(comp: CompiledSpec) -> set[str]:
    """Blocks whose Y is the transpose of one square 2-D parameter (batch 1), found by gathering a
    probe: Newton-Schulz then iterates on the parameter's own orientation, as Muon does."""
    candidates = {b.id: b.params[0] for b in comp.blocks
                  if b.batch == 1 and len(b.params) == 1 and b.mult == b.width
                  and comp.shapes[b.params[0]] == (b.mult, b.width)}
    if not candidates:
        return set()
    # one probe for all candidates: each holds its own parameter, so its block sees only that one
    probe = {n: torch.zeros(s, dtype=torch.float64) for n, s in comp.shapes.items()}
    for name in candidates.values():
        probe[name] = torch.arange(probe[name].numel(), dtype=torch.float64).reshape(probe[name].shape)
    ys = comp.gather(probe)
    return {bid for bid, name in candidates.items() if torch.equal(ys[bid][0], probe[name].T)}


def resolve_stats_dtype(choice: str, device: torch.device) -> torch.dtype:
    """The stats_dtype option -> the dtype of stored statistics and their matrix functions."""
    if choice == "float64" or (choice == "auto" and device.type != "mps"):
        return torch.float64
    return torch.float32


def stack_blocks(batch_blocks: bool | str, device: torch.device) -> bool:
    """Whether the Muon path stacks same-shape blocks into one call (ExecutionConfig.batch_blocks)."""
    return device.type != "cpu" if batch_blocks == "auto" else bool(batch_blocks)


WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile's OptimizedModule, DistributedDataParallel


def compile_subset(spec: Any, shapes: dict[str, tuple[int, ...]], sizes: dict[str, int] | None,
                   strict: bool | None) -> CompiledSpec:
    """`spec` compiled for the given parameters; with strict=None, rules that match none of them (frozen
    parameters left out of the optimizer, the torch idiom) are dropped with a warning naming the first. Names
    that all carry a wrapper's prefix and match no rule get an error that says how to unwrap."""
    try:
        return _compile_subset(spec, shapes, sizes, strict)
    except SpecError as err:
        wrapped = [p for p in WRAPPER_PREFIXES if shapes and all(n.startswith(p) for n in shapes)]
        if not wrapped or "no rule of the spec matches" not in err.reason and "matches no parameter" not in err.reason:
            raise
        raise SpecError(f"every parameter name starts with {wrapped[0]!r}, a wrapper's prefix, and no rule of the "
                        "spec matches them", file=err.file, key="params",
                        hint="pass the model itself, symo.Symo(model, ...) (a torch.compile'd module is unwrapped), "
                        f"or the wrapped model's parameters: model.{wrapped[0].rstrip('.')}.named_parameters()"
                        ) from None


def _compile_subset(spec: Any, shapes: dict[str, tuple[int, ...]], sizes: dict[str, int] | None,
                    strict: bool | None) -> CompiledSpec:
    if strict is not None:
        return compile_for(spec, shapes, sizes, strict)
    try:
        return compile_for(spec, shapes, sizes, True)
    except SpecError as err:
        if err.reason != "pattern matches no parameter of the model":
            raise
        names = (err.hint or "").split("; to use the spec")[0]  # bind's hint: the parameters that look similar
        warnings.warn(f"{err.file}: the spec's rule {err.key} matches no parameter given to Symo ({names}); "
                      "rules without parameters are dropped, and the parameters it meant to cover go to AdamW. "
                      "If frozen parameters were left out, pass strict=False to say so and silence this; "
                      "strict=True makes it an error", UserWarning, stacklevel=4)
        return compile_for(spec, shapes, sizes, False)
