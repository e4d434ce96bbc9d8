"""Symo: symmetry-structured curvature for PyTorch.

    spec = symo.load_spec("mlp_tanh")          # a bundled spec by name, or a path
    compiled = symo.compile(spec, model)          # or {name: shape}
    S = compiled.orbit_average(grads)             # symo.Curvature
    S.power(-0.5).matvec(grads)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
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
    "AlignResult": ".align", "interpolate": ".align", "repair": ".align", "barrier": ".align",
}
# public submodules by attribute: name -> module (symo.models is the training room's models)
_SUBMODULES = {"models": ".train.models", "hessian": ".hessian", "laplace": ".laplace", "experiments": ".experiments"}
__all__ = [
    "BlockInfo", "CompiledSpec", "Curvature", "NonFiniteGradientError", "NonFiniteUpdateError", "Spec", "SpecError",
    "PRESETS", "Symo", "SymoConfig", "SymmetryReport", "check_symmetry", "compile", "load_spec", "models", "parse_spec",
    "EquivarianceReport", "check_equivariance", "experiments",
]
__all__ += ["Inference", "check_spec", "infer", "infer_spec"]
__all__ += ["AlignResult", "align", "barrier", "interpolate", "repair"]


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
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES) | {"infer", "align"})


class _Package(types.ModuleType):
    """`symo.infer` is the function `symo.infer.infer`, also after the package symo.infer or one of its
    modules is imported (an import binds the package as an attribute of `symo`; that binding is ignored
    here). So reach the package's modules with `from symo.infer import trace` or `from symo.infer.trace
    import Tracer`: `import symo.infer.trace as trace` looks `trace` up on the function and fails."""

    @property
    def infer(self) -> Any:
        from .infer import infer  # on first use, like _LAZY: `import symo` does not import torch

        return infer

    @infer.setter
    def infer(self, value: Any) -> None:
        pass

    @property
    def align(self) -> Any:
        """`symo.align` is the function `symo.align.align` (the package symo.align holds it), as for infer."""
        from .align import align  # on first use: `import symo` does not import torch

        return align

    @align.setter
    def align(self, value: Any) -> None:
        pass


sys.modules[__name__].__class__ = _Package

# Modules that moved when symo/ was split into rooms (docs/architecture.md): the old import path keeps
# working for one release and warns. Each entry is "old module" -> "new module"; the README lists them.
_MOVED: dict[str, str] = {
    "symo.compiled": "symo.runtime.compiled", "symo.curvature": "symo.runtime.curvature",
    "symo.linalg": "symo.runtime.linalg", "symo.equivariance": "symo.runtime.symmetry",
    "symo.optim_checks": "symo.optim.checks", "symo.presets": "symo.optim.presets",
    "symo.baselines": "symo.hessian.baselines", "symo.laplace_fit": "symo.laplace.fitting",
    "symo.laplace_predict": "symo.laplace.predictive", "symo.zoo": "symo.experiments.zoo",
    "symo.infer_axes": "symo.infer.axes", "symo.infer_layout": "symo.infer.layout",
    "symo.infer_names": "symo.infer.names", "symo.infer_ops": "symo.infer.ops",
    "symo.infer_ops_nn": "symo.infer.ops_nn", "symo.infer_trace": "symo.infer.trace",
    "symo.infer_verify": "symo.infer.verify",
    # room 4, the training application (symo.train was a module; it is now the package, same names)
    "symo.train_config": "symo.train.config", "symo.data": "symo.train.data",
    "symo.data_mnist": "symo.train.data_mnist", "symo.checkpoint": "symo.train.checkpoint",
    "symo.runlog": "symo.train.runlog", "symo.progress": "symo.train.progress", "symo.models": "symo.train.models",
    "symo.models_resnet": "symo.train.models_resnet", "symo.rnn": "symo.train.rnn", "symo.muon": "symo.train.muon",
    # room 5, the command line (symo.cli was a module; it is now the package, with main)
    "symo.cli_train": "symo.cli.train", "symo.cli_equivariance": "symo.cli.equivariance",
}


# public names that live in a room but stay importable from the root without a warning
_PUBLIC_ALIASES = {"symo.models"}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves a moved module's old name to the module at its new place (the same module object, so
    `symo.models.GPT is symo.train.models.GPT`), with a DeprecationWarning naming the new place."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = _MOVED[spec.name]
        if spec.name not in _PUBLIC_ALIASES:
            warnings.warn(f"{spec.name} moved to {new}; import it from there (the old name goes away in the next "
                          f"release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__  # importlib overwrites __spec__ with the alias's
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # the module at its new place is already executed; give it back its own spec
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
