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
import os
import sys
import types
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compiled import CompiledSpec
    from .compiler import Spec

__version__ = "0.1.0"
# Everything is imported on first use (PEP 562): `import symo` and `symo --help` do not pay for torch,
# sympy and networkx until a name that needs them is touched.
_LAZY = {
    "BlockInfo": ".compiled", "CompiledSpec": ".compiled", "NonFiniteGradientError": ".compiled",
    "NonFiniteUpdateError": ".compiled", "PRESETS": ".presets",
    "Spec": ".compiler", "SpecError": ".compiler", "compile_spec": ".compiler", "load_spec": ".compiler",
    "parse_spec": ".compiler", "Curvature": ".curvature", "SymmetryReport": ".equivariance",
    "check_symmetry": ".equivariance", "EquivarianceReport": ".gauge", "check_equivariance": ".gauge",
    "Inference": ".infer", "check_spec": ".infer", "infer_spec": ".infer",
    "Symo": ".optim", "SymoConfig": ".optim",
}
_SUBMODULES = ("models", "zoo", "hessian", "laplace")
__all__ = [
    "BlockInfo", "CompiledSpec", "Curvature", "NonFiniteGradientError", "NonFiniteUpdateError", "Spec", "SpecError",
    "PRESETS", "Symo", "SymoConfig", "SymmetryReport", "check_symmetry", "compile", "load_spec", "models", "parse_spec",
    "EquivarianceReport", "check_equivariance", "zoo",
]
__all__ += ["Inference", "check_spec", "infer", "infer_spec"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif name in _SUBMODULES or (not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}")):
        value = importlib.import_module(f".{name}", __name__)  # symo.models, symo.compiler, ...
    else:
        raise AttributeError(f"module 'symo' has no attribute {name!r}")
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES) | {"infer"})


class _Package(types.ModuleType):
    """`symo.infer` is the function `symo.infer.infer`, also after the submodule is imported (importing
    `symo.infer` binds the module as an attribute of the package; that binding is ignored here)."""

    @property
    def infer(self) -> Any:
        from .infer import infer

        return infer

    @infer.setter
    def infer(self, value: Any) -> None:
        pass


sys.modules[__name__].__class__ = _Package

# Modules that moved when symo/ was split into rooms (docs/architecture.md): the old import path keeps
# working for one release and warns. Each entry is "old module" -> "new module"; the README lists them.
_MOVED: dict[str, str] = {}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves a moved module's old name to the module at its new place (the same module object, so
    `symo.models.GPT is symo.train.models.GPT`), with a DeprecationWarning naming the new place."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = _MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old name goes away in the next "
                      f"release)", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # the module at its new place is already executed


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())


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
    from .compiled import CompiledSpec
    from .compiler import Spec, compile_spec, load_spec

    if isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    elif not isinstance(spec, Spec):
        raise TypeError(f"compile: spec must be a Spec, a path or a bundled spec name (e.g. 'gpt_muon'), "
                        f"got {type(spec).__name__}")
    if not isinstance(strict, bool):
        raise TypeError(f"compile: strict must be True or False, got {strict!r}")
    return CompiledSpec(compile_spec(spec, shapes, sizes=sizes, cache_dir=cache_dir, disk_cache=disk_cache,
                                     strict=strict))
