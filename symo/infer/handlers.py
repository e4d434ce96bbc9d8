"""The tracer's operation table: every handler of symo/infer/ops.py (element-wise, reductions),
symo/infer/ops_shape.py (reshape, permutations, expand, split, concatenation, indexing) and symo/infer/ops_nn.py
(linear maps, attention, normalisation, convolution, pooling), joined in one place.

The tables are plain dicts built here rather than filled in by importing the handler modules, so reading
this file says which operations the tracer knows, and importing any one module has no effect on another.
"""

from __future__ import annotations

from . import ops, ops_nn, ops_shape
from .trace import Handler, Tracer

# The three tables share no operation name (tests/test_infer_modules.py checks it), so the order below does
# not decide which handler runs.
HANDLERS: dict[str, Handler] = {**ops.HANDLERS, **ops_shape.HANDLERS, **ops_nn.HANDLERS}
PREFIX_HANDLERS: tuple[tuple[str, Handler], ...] = ops_nn.PREFIX_HANDLERS


def new_tracer() -> Tracer:
    """A recording mode that knows every operation in `HANDLERS` and `PREFIX_HANDLERS`."""
    return Tracer(HANDLERS, PREFIX_HANDLERS)
