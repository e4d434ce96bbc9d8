"""Room 2: the Symo optimizer (docs/architecture.md).

- optimizer.py: `Symo`, one step from the gradients to the parameter update;
- config.py: `SymoConfig` and its per-feature dataclasses; presets.py: the named configurations;
- plan.py: the per-block plan made at construction; statistics.py: the stored block statistics;
- matrix_functions.py: the per-block matrix-function backends; adamw.py: the AdamW fallback;
- checks.py: input and state-dict checks; report.py: `describe()` and `memory_report()`;
- distributed.py: several processes (FSDP2, DDP): coupling components, their owners, the exchanges.

Imports only from `symo.compiler` (room 0) and `symo.runtime` (room 1). The names below load on first
use (PEP 562), so the presets (plain data) can be read without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module of this package that defines it
_LAZY = {
    "GROUP_KEYS": ".checks", "AdamWConfig": ".config", "CurvatureConfig": ".config", "DistributedConfig": ".config",
    "ExecutionConfig": ".config",
    "MatrixFunctionConfig": ".config", "MomentumConfig": ".config", "SymoConfig": ".config",
    "UpdateConfig": ".config", "Symo": ".optimizer", "auto_backend": ".plan", "PRESETS": ".presets",
    "Preset": ".presets", "get_preset": ".presets",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'symo.optim' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
