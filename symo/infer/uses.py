"""Which inferred spec serves which tool: the line `Inference.report()` (and so `symo infer`) prints.

The true group of a transformer has a residual-stream permutation, so the orbit average shares one small
statistic across most of the model and a Symo step with it is close to normalised SGD. On the small
transformer of tests/test_one_line.py (300 steps): validation loss 0.78 with the true group, 0.72 with the
Muon-style relaxation, 0.74 for AdamW at its best of three rates (docs/infer.md, "Which spec for what").
The true group is the right spec for the curvature and alignment tools, which need the loss's own
symmetries; the Muon-style relaxation is the right one for training.
"""

from __future__ import annotations

TOOLS = "the curvature and alignment tools (symo.hessian, symo.laplace, symo align / merge, symo equivariance)"


def usage_line(relax: str | None) -> str:
    """One report line: what the spec of this inference serves, and which spec serves the other use."""
    if relax == "muon":
        return (f"use: training. This is the Muon-style relaxation (symo.Symo(model) infers it); the true group "
                f"(symo infer without --relax) is the spec for {TOOLS}.")
    if relax == "muon_pieces":
        return ("use: training. This is the Muon-style relaxation with each piece of a fused matrix a matrix of its "
                "own (symo.Symo(model) infers the one without pieces, --relax muon); the true group (symo infer "
                f"without --relax) is the spec for {TOOLS}.")
    return (f"use: {TOOLS}; this is the model's true symmetry group. For training use the Muon-style relaxation "
            "(symo infer --relax muon; symo.Symo(model) infers it): where one space spans many layers (a residual "
            "stream) the true group shares one small statistic across most of the model, and its step is close to "
            "normalised SGD (the optimizer warns).")
