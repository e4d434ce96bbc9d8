"""Benchmark arms that are a Symo preset, named the same way in every benchmark that trains them.

    preset_options("preset_shampoo")          # {"preset": "shampoo"}
    preset_options("preset_notebook@adamw")   # {"preset": "notebook", "update_scale": "adamw"}
    preset_options("preset_soap~muon")        # {"preset": "soap"}; preset_spec(...) == "muon"
    preset_options("adam")                    # None: not a preset arm

An arm "preset_<name>" is Symo with preset=<name> (symo.PRESETS) and nothing else changed; "@<scale>" sets
update_scale (the alternative scales benchmarks/lr_transfer.py tries); "~muon" trains it on the benchmark's
Muon-style spec instead of its own (preset_spec). train_mlp, rnn_train and paper_mlp build such arms with their
own spec, the network's true symmetry group ("true"), or with a Muon-style one ("muon": a private signed_perm
row space per weight matrix, biases to Symo's AdamW: specs/muon.toml for the MLPs, specs/rnn_muon.toml for the
RNN), so lr_transfer can run every preset on each of them through the benchmark's own training function and
run cache.
"""

from __future__ import annotations

from typing import Any

PREFIX = "preset_"
SPECS = ("true", "muon")  # the benchmark's own spec (the network's true group); a Muon-style spec


def arm_name(preset: str, update_scale: str | None = None, spec: str = "true") -> str:
    """The arm of `preset` (at `update_scale`, None: the preset's own; on the benchmark's `spec` variant)."""
    if spec not in SPECS:
        raise ValueError(f"unknown spec variant {spec!r}; use one of {SPECS}")
    return PREFIX + preset + (f"@{update_scale}" if update_scale else "") + ("" if spec == "true" else f"~{spec}")


def _parts(arm: str) -> tuple[str, str, str]:
    """(preset, update scale or '', spec variant) of a preset arm."""
    rest, _, spec = arm[len(PREFIX):].partition("~")
    name, _, scale = rest.partition("@")
    spec = spec or "true"
    if spec not in SPECS:
        raise ValueError(f"{arm}: unknown spec variant {spec!r}; use one of {SPECS}")
    return name, scale, spec


def preset_options(arm: str) -> dict[str, Any] | None:
    """Symo's keyword options of a preset arm; None when `arm` is not one. An unknown preset is a ValueError."""
    if not arm.startswith(PREFIX):
        return None
    name, scale, _spec = _parts(arm)
    from symo.optim.presets import get_preset

    options: dict[str, Any] = {"preset": get_preset(name).name}
    if scale:
        options["update_scale"] = scale
    return options


def preset_spec(arm: str) -> str:
    """The spec variant a preset arm trains on: "muon" for "preset_<name>[@scale]~muon", "true" otherwise (every
    other arm, preset or not, uses the benchmark's own spec)."""
    return _parts(arm)[2] if arm.startswith(PREFIX) else "true"
