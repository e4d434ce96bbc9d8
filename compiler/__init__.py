"""The Symo compiler: spec -> bound spec -> structure -> generated code -> cache.

Each stage is a pure function with one data type at its boundary:

    parse_spec / load_spec : TOML text     -> Spec            (compiler.parse)
    bind                   : Spec + shapes -> BoundSpec       (compiler.validate)
    derive_structure       : BoundSpec     -> Structure       (compiler.structure)
    generate               : Structure     -> GeneratedCode   (compiler.codegen)
    compile_spec           : all of it, through the memory and disk caches -> GeneratedModule
"""

from __future__ import annotations

import hashlib
import linecache
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cache import DiskCache, default_cache_dir
from .codegen import CODEGEN_VERSION, GeneratedCode, generate
from .errors import SpecError
from .parse import GROUPS, ParamRule, SpaceDecl, Spec, load_spec, parse_spec
from .structure import IsotypicBlock, Structure, derive_structure
from .validate import BoundSpec, bind, shapes_of

__all__ = [
    "GROUPS", "BoundSpec", "DiskCache", "GeneratedCode", "GeneratedModule", "IsotypicBlock", "ParamRule",
    "SpaceDecl", "Spec", "SpecError", "Structure", "bind", "compile_spec", "default_cache_dir",
    "derive_structure", "generate", "load_spec", "parse_spec", "shapes_of",
]


@dataclass(frozen=True)
class GeneratedModule:
    """The compiled artefact: generated source, where it lives, and its executed namespace."""

    key: str
    source: str
    path: Path | None
    namespace: dict[str, Any]
    bound: BoundSpec
    from_cache: str  # "memory", "disk" or "built"


_MEMORY: dict[str, GeneratedModule] = {}


def cache_key(spec: Spec, bound: BoundSpec) -> str:
    text = f"v{CODEGEN_VERSION}|{spec.canonical()}|{bound.key_material()}"
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def compile_spec(spec: Spec, shapes: Any, *, sizes: dict[str, int] | None = None,
                 cache_dir: str | Path | None = None, disk_cache: bool = True) -> GeneratedModule:
    """Run the pipeline. `shapes` is {name: shape} or an nn.Module; `sizes` sets space sizes that the
    shapes leave open (see `bind`). Nothing is cached from a failed compile."""
    bound = bind(spec, shapes_of(shapes), sizes)
    key = cache_key(spec, bound)
    disk = _disk(cache_dir) if disk_cache else None
    hit = _MEMORY.get(key)
    if hit is not None:
        path = None
        if disk is not None and disk.usable:  # honour this call's disk settings, not the first call's
            path = disk.path(key) if disk.load(key) == hit.source else disk.store(key, hit.source)
        return GeneratedModule(hit.key, hit.source, path, hit.namespace, bound, "memory")
    source = disk.load(key) if disk else None
    origin = "disk"
    if source is not None:
        try:
            namespace = _execute(source, disk.path(key))
        except Exception:  # an entry from an older codegen that no longer runs: rebuild it
            source = None
    if source is None:
        source = generate(derive_structure(bound), key).source
        path = disk.store(key, source) if disk else None
        namespace = _execute(source, path or Path(f"<symo-generated-{key[:12]}>"))
        origin = "built"
    path = disk.path(key) if disk and disk.usable else None
    module = GeneratedModule(key, source, path, namespace, bound, origin)
    _MEMORY[key] = module
    return module


_DISKS: dict[Path, DiskCache] = {}


def _disk(cache_dir: str | Path | None) -> DiskCache:
    """One DiskCache per directory and process, so warm compiles do not re-stat the directory."""
    path = Path(cache_dir) if cache_dir else default_cache_dir()
    if path not in _DISKS:
        _DISKS[path] = DiskCache(path)
    return _DISKS[path]


def _execute(source: str, path: Path) -> dict[str, Any]:
    filename = str(path)
    # register the text so tracebacks and inspect show generated lines even without a disk cache
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": f"symo_generated_{path.stem}"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace
