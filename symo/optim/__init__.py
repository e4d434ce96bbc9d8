"""Room 2: the Symo optimizer (docs/architecture.md).

- optimizer.py: `Symo`, one step from the gradients to the parameter update;
- config.py: `SymoConfig` and its per-feature dataclasses; presets.py: the named configurations;
- plan.py: the per-block plan made at construction; statistics.py: the stored block statistics;
- matrix_functions.py: the per-block matrix-function backends; adamw.py: the AdamW fallback;
- checks.py: input and state-dict checks; report.py: `describe()` and `memory_report()`;
- distributed.py: several processes (FSDP2, DDP): coupling components, their owners, the exchanges.

Imports only from `symo.compiler` (room 0) and `symo.runtime` (room 1).
"""

from .checks import GROUP_KEYS
from .config import (
    AdamWConfig,
    CurvatureConfig,
    DistributedConfig,
    ExecutionConfig,
    MatrixFunctionConfig,
    MomentumConfig,
    SymoConfig,
    UpdateConfig,
)
from .optimizer import Symo
from .plan import auto_backend
from .presets import PRESETS, Preset, get_preset

__all__ = ["GROUP_KEYS", "PRESETS", "AdamWConfig", "CurvatureConfig", "DistributedConfig", "ExecutionConfig",
           "MatrixFunctionConfig", "MomentumConfig", "Preset", "Symo", "SymoConfig", "UpdateConfig", "auto_backend",
           "get_preset"]
