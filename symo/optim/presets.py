"""Named Symo configurations: `Symo(..., preset="paper" | "muon" | "shampoo")`.

A preset is a set of `SymoConfig` values plus a recommended starting learning rate. Options passed
explicitly to `Symo` override the preset's values; `describe()` names the preset and every value that
differs from it.

- paper: the orbit-averaged curvature method as published. H = S_g^{1/2} with S_g a bias-corrected EMA
  (0.95) of the block statistics of the raw gradient, no gradient momentum, no damping (pseudo-inverse
  of S_g, zeros dropped), exact powers by eigh, statistics and matrix functions in float64.
- muon: exactly Muon (momentum 0.95 with Nesterov, the quintic Newton–Schulz iteration, Muon's update
  scale), with a Muon spec (specs/muon.toml, specs/gpt_muon.toml) equal to the reference Muon.
- shampoo: a running sum (beta2 = 1) of the block statistics of the raw gradient, started from
  epsilon I (absolute damping 1e-8, Shampoo's epsilon), exact inverse square root by eigh, no momentum.
  On the spec's structure this is one-sided Shampoo (AdaGrad's full-matrix form per block); two-sided
  Shampoo L^{-1/4} G R^{-1/4} is `geometric_mean_with=` a second spec (docs/theory.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Preset:
    """A named configuration: SymoConfig values and the learning rate to start tuning from."""

    name: str
    values: MappingProxyType
    lr: float
    summary: str


def _preset(name: str, lr: float, summary: str, **values: Any) -> Preset:
    return Preset(name, MappingProxyType(values), lr, summary)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    _preset("paper", 0.03, "the published method: averaged S_g^{-1/2} g, no momentum, exact float64 powers",
            beta1=0.0, nesterov=False, beta2=0.95, source="gradient", damping=0.0, damping_mode="relative",
            estimator="gradient", power=-0.5, backend="eigh", stats_dtype="float64", update_scale="natural",
            precondition_frequency=1),
    _preset("muon", 0.02, "Muon: momentum 0.95 (Nesterov), quintic Newton-Schulz polar factor, Muon's scale",
            beta1=0.95, nesterov=True, beta2=0.0, source="momentum", estimator="gradient", power=-0.5,
            backend="newton_schulz", ns_method="iterate", ns_dtype="float32", update_scale="muon",
            precondition_frequency=1),
    _preset("shampoo", 0.05, "one-sided Shampoo per block: running sum from eps I, exact inverse root",
            beta1=0.0, nesterov=False, beta2=1.0, source="gradient", damping=1e-8, damping_mode="absolute",
            estimator="gradient", power=-0.5, backend="eigh", stats_dtype="float64", update_scale="natural",
            precondition_frequency=1),
)}


def get_preset(name: str) -> Preset:
    """The preset called `name`; a ValueError listing the presets otherwise."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; the presets are {sorted(PRESETS)} "
                         "(or pass no preset and set the options yourself)")
    return PRESETS[name]


__all__ = ["PRESETS", "Preset", "get_preset"]
