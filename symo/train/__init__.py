"""Room 4, the training application: `symo train`'s loop (loop.py), its options (config.py), the optimizer a
run names (optimizers.py), data, checkpoints, the run folder's lock (rundir.py), the memory check of a step
(memory.py), run log, progress bars, the models the bundled specs describe, and the Muon baseline.

    from symo.train import TrainConfig, train
    result = train(TrainConfig(steps=200))         # prints nothing; observer= sees the progress (events.py)

`symo.train` was one module before; its public names stay importable from here. They load on first
use (PEP 562), so `symo train --help`, which reads only the options in config.py, does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module of this package that defines it
_LAZY = {
    "DEFAULT_LR": ".config", "DEFAULT_WEIGHT_DECAY": ".config", "OPTIMIZERS": ".config", "RESUME_KEYS": ".config",
    "TrainConfig": ".config",
    "RunStart": ".events", "StepReport": ".events", "TrainInterrupted": ".events", "TrainObserver": ".events",
    "build_optimizer": ".optimizers", "evaluate": ".loop", "lr_factor": ".loop", "sample": ".loop",
    "saved_options": ".loop", "train": ".loop",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'symo.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
