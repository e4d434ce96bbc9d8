"""Named Symo configurations: `Symo(..., preset="published" | "notebook" | "muon" | "shampoo" | "eigen_adam" |
"then_orthogonalize" | "soap_muon")`.

A preset is a set of `SymoConfig` values (the preconditioner kind among them) plus a recommended starting
learning rate. Options passed explicitly to `Symo` override the preset's values; `describe()` names the preset
and every value that differs from it.

- published: the Symo step as the method was published (kinds/published.py): momentum 0.9, the centred
  statistic of the debiased momentum in an EMA (0.99), the weights' S_w, H_inv = S_w # S_g^{-1} with every
  power damped by 1e-4 of its matrix's largest eigenvalue (damping_scope "all"), float64 eigendecompositions.
- notebook: the authors' early notebooks: S_g^{-1/2} g with S_g a
  bias-corrected EMA (0.95) of the block statistics of the raw gradient, no gradient momentum, no damping
  (pseudo-inverse), exact powers by eigh, statistics in float64.
- muon: exactly Muon (momentum 0.95 with Nesterov, the quintic Newton–Schulz iteration, Muon's update
  scale); with a Muon spec (specs/muon.toml, specs/gpt_muon.toml) equal to the reference Muon.
- shampoo: a running sum (beta2 = 1) of the block statistics of the raw gradient, started from epsilon I
  (absolute damping 1e-8, Shampoo's epsilon), exact inverse square root by eigh, no momentum: one-sided
  Shampoo on the spec's blocks (two-sided: `geometric_mean_with=` a second spec).
- eigen_adam: Adam in each block's curvature eigenbasis (the multiplicity side, which the group leaves free) with
  SOAP's conventions and settings (betas 0.95, statistic EMA 0.95, first step skipped, bases from earlier
  gradients, refreshed by one power iteration and QR every 10 steps, statistics in float32 as SOAP keeps them).
- soap: SOAP itself on every block: eigen_adam with `two_sided=True`, so each block's other side (the one the
  group moves) gets its own Kronecker factor from the same spec; on a Muon-style spec it is the authors' SOAP
  on every weight matrix, with their defaults.
- soap_heavyball: the same SOAP with heavyball's conventions where that library differs from the authors' code
  (its refresh one step earlier, every 2 steps; eps as a clamp, max(sqrt(v_hat), eps); the QR product shifted by
  heavyball's lift; beta1 0.9; sides up to 2048): the campaign's heavyball arm, matched.
- then_orthogonalize: PMuon's rule, polar(S^{-0.3} u) with Muon's momentum and scale, the statistic an EMA
  (0.95) of the raw gradient's block statistics, refreshed every 10 steps, in float32 (the mild -0.3 power
  with relative damping 1e-6 needs no float64).
- soap_muon: `then_orthogonalize` with SOAP as its inner kind, on both sides: the polar factor of SOAP's
  direction (SOAP's conventions, refresh every 10 steps, float32 statistics), Muon's momentum and scale.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .bases import PowerQR


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
    _preset("published", 0.05, "the published Symo step: momentum 0.9, EMA 0.99 of the debiased momentum's centred "
            "statistic, S_w from the weights, H_inv = S_w # S_g^{-1} damped 1e-4, float64",
            preconditioner="published", beta1=0.9, nesterov=False, beta2=0.99, damping=1e-4, damping_scope="all",
            precondition_frequency=1, stats_dtype="float64", update_scale="natural"),
    _preset("notebook", 0.01, "the early notebooks' rule: averaged S_g^{-1/2} g of the raw gradient, no momentum, "
            "exact float64 powers",
            preconditioner="root", beta1=0.0, nesterov=False, beta2=0.95, statistic="gradient", damping=0.0,
            damping_mode="relative", power=-0.5, backend="eigh", stats_dtype="float64", update_scale="natural",
            precondition_frequency=1),
    _preset("muon", 0.02, "Muon: momentum 0.95 (Nesterov), quintic Newton-Schulz polar factor, Muon's scale",
            preconditioner="polar", beta1=0.95, nesterov=True, statistic="momentum", power=-0.5,
            backend="newton_schulz", ns_method="iterate", ns_dtype="float32", update_scale="muon"),
    _preset("shampoo", 0.05, "one-sided Shampoo per block: running sum from eps I, exact inverse root",
            preconditioner="root", beta1=0.0, nesterov=False, beta2=1.0, statistic="gradient", damping=1e-8,
            damping_mode="absolute", power=-0.5, backend="eigh", stats_dtype="float64", update_scale="natural",
            precondition_frequency=1),
    _preset("eigen_adam", 9e-3, "Adam in each block's curvature eigenbasis (SOAP's settings: betas 0.95, "
            "eigenbasis every 10 steps)",
            preconditioner="eigen_adam", beta1=0.95, nesterov=False, beta2=0.95, adam_beta2=0.95, eps=1e-8,
            statistic="gradient", precondition_frequency=10, stats_dtype="float32", update_scale="natural"),
    _preset("soap", 9e-3, "SOAP (Vyas et al. 2024) on every block, both sides from one spec: the authors' algorithm "
            "and defaults (betas 0.95, shampoo_beta 0.95, eps 1e-8, QR refresh every 10 steps, first step skipped)",
            preconditioner="eigen_adam", two_sided=True, beta1=0.95, nesterov=False, beta2=0.95, adam_beta2=0.95,
            eps=1e-8, statistic="gradient", precondition_frequency=10, max_precond_dim=10000, first_step="skip",
            statistic_timing="after", null_directions="keep", eps_placement="authors", stats_dtype="float32",
            update_scale="natural"),
    _preset("soap_heavyball", 9e-3, "SOAP with heavyball's conventions and defaults: betas (0.9, 0.95), refresh every "
            "2 steps one step earlier than the authors', eps as a clamp, QR with heavyball's shift, sides up to 2048",
            preconditioner="eigen_adam", two_sided=True, beta1=0.9, nesterov=False, beta2=0.95, adam_beta2=0.95,
            eps=1e-8, statistic="gradient", precondition_frequency=2, max_precond_dim=2048, first_step="skip",
            statistic_timing="after", null_directions="keep", eps_placement="clamp", refresh_phase="heavyball",
            refresh=PowerQR(lift=1e-8), stats_dtype="float32", update_scale="natural"),
    _preset("then_orthogonalize", 0.02, "PMuon: polar(S^-0.3 u), Muon's momentum and scale, EMA 0.95 of the "
            "gradient's statistic every 10 steps",
            preconditioner="then_orthogonalize", inner="root", power=-0.3, beta1=0.95, nesterov=True, beta2=0.95,
            statistic="gradient", precondition_frequency=10, stats_dtype="float32", update_scale="muon"),
    _preset("soap_muon", 0.02, "SOAP-Muon: the polar factor of SOAP's direction (both sides from one spec), Muon's "
            "momentum and scale",
            preconditioner="then_orthogonalize", inner="eigen_adam", two_sided=True, beta1=0.95, nesterov=True,
            beta2=0.95, statistic="gradient", precondition_frequency=10, stats_dtype="float32", update_scale="muon"),
)}


def get_preset(name: str) -> Preset:
    """The preset called `name`; a ValueError listing the presets otherwise."""
    if not isinstance(name, str) or name not in PRESETS:
        key = name.lower().replace("-", "_") if isinstance(name, str) else ""
        close = [key] if key in PRESETS else difflib.get_close_matches(key, list(PRESETS), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""  # difflib, not the compiler's: plain data here
        raise ValueError(f"unknown preset {name!r}{hint}; the presets are {sorted(PRESETS)} "
                         "(or pass no preset and set the options yourself)")
    return PRESETS[name]


__all__ = ["PRESETS", "Preset", "get_preset"]
