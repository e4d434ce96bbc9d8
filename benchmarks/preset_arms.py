"""Benchmark arms that are a Symo preset, named the same way in every benchmark that trains them.

    preset_options("preset_shampoo")          # {"preset": "shampoo"}
    preset_options("preset_notebook@adamw")   # {"preset": "notebook", "update_scale": "adamw"}
    preset_options("adam")                    # None: not a preset arm

An arm "preset_<name>" is Symo with preset=<name> (symo.PRESETS) and nothing else changed; "@<scale>" sets
update_scale (the alternative scales benchmarks/lr_transfer.py tries). train_mlp, rnn_train and paper_mlp
build such arms with their own spec, so lr_transfer can run every preset on each of them through the
benchmark's own training function and run cache.
"""

from __future__ import annotations

from typing import Any

PREFIX = "preset_"


def arm_name(preset: str, update_scale: str | None = None) -> str:
    """The arm of `preset` (at `update_scale`, None: the preset's own)."""
    return PREFIX + preset + (f"@{update_scale}" if update_scale else "")


def preset_options(arm: str) -> dict[str, Any] | None:
    """Symo's keyword options of a preset arm; None when `arm` is not one. An unknown preset is a ValueError."""
    if not arm.startswith(PREFIX):
        return None
    name, _, scale = arm[len(PREFIX):].partition("@")
    from symo.optim.presets import get_preset

    options: dict[str, Any] = {"preset": get_preset(name).name}
    if scale:
        options["update_scale"] = scale
    return options
