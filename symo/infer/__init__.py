"""Spec inference: a model's weight-space symmetry spec from the nn.Module, verified numerically.

    spec = symo.infer_spec(model, example_inputs)        # a Spec
    result = symo.infer.infer(model, example_inputs)     # + the verification report
    checks = symo.check_spec(spec, model)                # does a given spec hold for this model?
    train = symo.infer.training_spec(model)              # the Muon-style relaxation: the spec for training

The true group (`infer_spec`) is the spec for the curvature and alignment tools; `training_spec` (what
`symo.Symo(model)` uses) is the one for training (uses.py says so in every report).

Room 3 of docs/architecture.md: imports only from `symo.compiler` (room 0) and `symo.runtime` (room 1).
inference.py is the driver; trace.py records a forward pass with the operation table of handlers.py
(ops.py, ops_nn.py); axes.py, layout.py and names.py turn the trace into a spec; verify.py checks it.
"""

from .inference import (
    Inference,
    SpaceCheck,
    SpaceResult,
    check_spec,
    default_example_inputs,
    infer,
    infer_spec,
    normalize_inputs,
    training_spec,
)

__all__ = [
    "Inference", "SpaceCheck", "SpaceResult", "check_spec", "default_example_inputs", "infer", "infer_spec",
    "normalize_inputs", "training_spec",
]
