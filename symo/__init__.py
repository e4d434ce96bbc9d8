"""Symo: symmetry-structured curvature for PyTorch.

    spec = symo.load_spec("mlp_tanh")          # a bundled spec by name, or a path
    compiled = symo.compile(spec, model)          # or {name: shape}
    S = compiled.orbit_average(grads)             # symo.Curvature
    S.power(-0.5).matvec(grads)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import models
from . import zoo as zoo
from .compiled import BlockInfo, CompiledSpec, NonFiniteGradientError
from .compiler import Spec as Spec
from .compiler import SpecError, compile_spec, load_spec, parse_spec
from .curvature import Curvature
from .equivariance import SymmetryReport, check_symmetry
from .gauge import EquivarianceReport, check_equivariance
from .optim import Symo, SymoConfig

__version__ = "0.1.0"
__all__ = [
    "BlockInfo", "CompiledSpec", "Curvature", "NonFiniteGradientError", "Spec", "SpecError",
    "Symo", "SymoConfig", "SymmetryReport", "check_symmetry", "compile", "load_spec", "models", "parse_spec",
    "EquivarianceReport", "check_equivariance", "zoo",
]


def compile(spec: Spec | str | Path, shapes: Any, *, sizes: dict[str, int] | None = None,
            cache_dir: str | Path | None = None, disk_cache: bool = True) -> CompiledSpec:
    """Compile a spec (a `Spec`, or a path to a spec file) for `shapes` ({name: shape} or an nn.Module).

    `sizes` supplies space sizes the shapes cannot decide, e.g. {"head{i}": 4} for n_head.
    The generated code is cached in memory and on disk (see README, "Kernel cache"); a second call
    with the same spec and shapes costs a parse and a hash.
    """
    if isinstance(spec, (str, Path)):
        spec = load_spec(spec)
    return CompiledSpec(compile_spec(spec, shapes, sizes=sizes, cache_dir=cache_dir, disk_cache=disk_cache))
