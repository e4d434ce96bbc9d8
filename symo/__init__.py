"""Symo: symmetry-structured curvature for PyTorch.

    spec = symo.load_spec("mlp_tanh")          # a bundled spec by name, or a path
    compiled = symo.compile(spec, model)          # or {name: shape}
    S = compiled.orbit_average(grads)             # symo.Curvature
    S.power(-0.5).matvec(grads)
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compiler import Spec
    from .runtime.compiled import compile

__version__ = "0.1.0"
# Everything is imported on first use (PEP 562): `import symo` and `symo --help` do not pay for torch,
# sympy and networkx until a name that needs them is touched.
_LAZY = {
    "BlockInfo": ".runtime.compiled", "CompiledSpec": ".runtime.compiled",
    "NonFiniteGradientError": ".runtime.compiled", "NonFiniteUpdateError": ".runtime.compiled",
    "PRESETS": ".optim.presets",
    "Spec": ".compiler", "SpecError": ".compiler", "compile_spec": ".compiler", "load_spec": ".compiler",
    "parse_spec": ".compiler", "Curvature": ".runtime.curvature", "SymmetryReport": ".runtime.symmetry",
    "check_symmetry": ".runtime.symmetry", "EquivarianceReport": ".gauge", "check_equivariance": ".gauge",
    "Inference": ".infer", "check_spec": ".infer", "infer_spec": ".infer",
    "Symo": ".optim", "SymoConfig": ".optim", "compile": ".runtime.compiled",
    "AlignResult": ".alignment", "align": ".alignment", "interpolate": ".alignment", "repair": ".alignment",
    "barrier": ".alignment",
}
# public submodules by attribute: name -> module (symo.models is the training room's models; symo.infer,
# the spec-inference package, and the other packages load through the last branch of __getattr__)
_SUBMODULES = {"models": ".train.models", "hessian": ".hessian", "laplace": ".laplace", "experiments": ".experiments"}
__all__ = [
    "BlockInfo", "CompiledSpec", "Curvature", "NonFiniteGradientError", "NonFiniteUpdateError", "Spec", "SpecError",
    "PRESETS", "Symo", "SymoConfig", "SymmetryReport", "check_symmetry", "compile", "load_spec", "models", "parse_spec",
    "EquivarianceReport", "check_equivariance", "experiments", "Inference", "check_spec", "infer", "infer_spec",
    "AlignResult", "align", "barrier", "interpolate", "repair",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name], __name__)  # symo.models, symo.hessian, ...
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
        value = importlib.import_module(f".{name}", __name__)  # symo.compiler, symo.train, ...
    else:
        raise AttributeError(f"module 'symo' has no attribute {name!r}")
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES) | {"infer"})
