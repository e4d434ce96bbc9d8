"""Symo: symmetry-structured curvature for PyTorch.

    spec = symo.load_spec("mlp_tanh")          # a bundled spec by name, or a path
    compiled = symo.compile(spec, model)          # or {name: shape}
    S = compiled.orbit_average(grads)             # symo.Curvature
    S.power(-0.5).matvec(grads)
"""

from __future__ import annotations

import os
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
from .infer import Inference, check_spec, infer, infer_spec
from .optim import Symo, SymoConfig

__version__ = "0.1.0"
__all__ = [
    "BlockInfo", "CompiledSpec", "Curvature", "NonFiniteGradientError", "Spec", "SpecError",
    "Symo", "SymoConfig", "SymmetryReport", "check_symmetry", "compile", "load_spec", "models", "parse_spec",
    "EquivarianceReport", "check_equivariance", "zoo",
]
__all__ += ["Inference", "check_spec", "infer", "infer_spec"]


def compile(spec: Spec | str | Path, shapes: Any, *, sizes: dict[str, int] | None = None,
            cache_dir: str | Path | None = None, disk_cache: bool = True, strict: bool = True) -> CompiledSpec:
    """Compile a spec (a `Spec`, or a path to a spec file) for `shapes` ({name: shape} or an nn.Module).

    `sizes` supplies space sizes the shapes cannot decide, e.g. {"head{i}": 4} for n_head.
    `strict=False` compiles the spec for a subset of the parameters it was written for (fine-tuning
    part of a model): rules that match no parameter are dropped, with the spaces and blocks that
    then have none; with `strict=True` such a rule is a SpecError.
    The generated code is cached in memory and on disk (see README, "Kernel cache"); a second call
    with the same spec and shapes costs a parse and a hash.
    """
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"compile: cache_dir must be a path, got {type(cache_dir).__name__}")
    if not isinstance(disk_cache, bool):
        raise TypeError(f"compile: disk_cache must be True or False, got {disk_cache!r}")
    if isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    elif not isinstance(spec, Spec):
        raise TypeError(f"compile: spec must be a Spec, a path or a bundled spec name (e.g. 'gpt_muon'), "
                        f"got {type(spec).__name__}")
    if not isinstance(strict, bool):
        raise TypeError(f"compile: strict must be True or False, got {strict!r}")
    return CompiledSpec(compile_spec(spec, shapes, sizes=sizes, cache_dir=cache_dir, disk_cache=disk_cache,
                                     strict=strict))
from . import hessian as hessian  # noqa: E402
