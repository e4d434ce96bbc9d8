"""Aligning and merging models modulo their weight-space symmetry, from the same spec Symo compiles.

    result = symo.align(reference, other, "mlp_relu")  # or spec=None: inferred and verified
    result.model, result.elements, print(result.report())
    merged = symo.interpolate(reference, result.model, 0.5)
    merged = symo.repair(merged, data, parents=(reference, result.model))
    path = symo.barrier(reference, result.model, loss_fn, data)

Room 4 of docs/architecture.md: it imports the compiler (room 0), the runtime's group action (room 1)
and spec inference and checking (`symo.infer`, room 3). alignment.py is the driver, matching.py the
weight-matching solver, activations.py locates spaces in the forward pass, merge.py interpolates,
repairs and measures barriers, result.py holds what `align` returns. docs/align.md explains the workflow.
"""

from .alignment import METHODS, align
from .merge import BarrierResult, barrier, evaluate, interpolate, plot_paths, repair
from .result import AlignError, AlignResult, AlignWarning, SpaceReport

__all__ = ["METHODS", "AlignError", "AlignResult", "AlignWarning", "BarrierResult", "SpaceReport", "align",
           "barrier", "evaluate", "interpolate", "plot_paths", "repair"]
