"""Room 2: the Symo optimizer (docs/architecture.md).

- optimizer.py: `Symo`, one step from the gradients to the parameter update (one gather -> kind -> scatter loop);
- kinds/: the block-preconditioner interface (base.py) and one file per kind (polar, root, taylor, published,
  eigen_adam, then_orthogonalize), each with its config dataclass;
- config.py: `SymoConfig` and its per-feature dataclasses; presets.py: the named configurations;
- plan.py: the per-block plan made at construction;
- matrix_function_configs.py: the matrix functions as frozen configs (Eigh, PowerQR, NewtonSchulz, CoupledNewton,
  Auto); matrix_functions.py: their per-block evaluation; adamw.py: the AdamW fallback;
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
    "GROUP_KEYS": ".checks", "AdamWConfig": ".config", "DistributedConfig": ".config", "ExecutionConfig": ".config",
    "MomentumConfig": ".config", "SymoConfig": ".config", "UpdateConfig": ".config", "Symo": ".optimizer",
    "PRESETS": ".presets", "Preset": ".presets", "get_preset": ".presets", "KINDS": ".kinds",
    "PolarConfig": ".kinds", "RootConfig": ".kinds", "TaylorConfig": ".kinds", "PublishedConfig": ".kinds",
    "EigenAdamConfig": ".kinds", "ThenOrthogonalizeConfig": ".kinds",
    **{name: ".matrix_function_configs" for name in ("Auto", "CoupledNewton", "Eigh", "NewtonSchulz", "PowerQR")},
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
