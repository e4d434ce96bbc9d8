"""The Symo compiler: spec -> bound spec -> structure -> generated code -> cache.

Each stage is a pure function with one data type at its boundary:

    parse_spec / load_spec : TOML text     -> Spec            (compiler.parse)
    bind                   : Spec + shapes -> BoundSpec       (compiler.bind)
    derive_structure       : BoundSpec     -> Structure       (compiler.structure; compiler.repeated
                                                               where a space repeats within one tensor)
    generate               : Structure     -> GeneratedCode   (compiler.codegen, codegen_template,
                                                               codegen_repeated, all through compiler.emit)
    compile_spec           : all of it, through the memory and disk caches -> GeneratedModule
"""

from __future__ import annotations

import gc
import hashlib
import linecache
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bind import bind, shapes_of
from .bound import BoundSpec
from .cache import DiskCache, cache_key_text, default_cache_dir
from .codegen import generate
from .codegen_repeated import generate_repeated
from .codegen_template import generate_templated
from .emit import GeneratedCode
from .errors import SpecError
from .parse import GROUPS, ParamRule, SpaceDecl, Spec, SpecShadowWarning, load_spec, parse_spec
from .repeated import derive_repeated, has_repeated_spaces, key_material
from .structure import IsotypicBlock, Structure, derive_structure
from .templates import TEMPLATES_VERSION, TemplatePlan, find_families

__all__ = [
    "GROUPS", "BoundSpec", "DiskCache", "GeneratedCode", "GeneratedModule", "IsotypicBlock", "ParamRule",
    "SpaceDecl", "Spec", "SpecError", "SpecShadowWarning", "Structure", "bind", "compile_spec", "default_cache_dir",
    "derive_structure", "generate", "load_spec", "parse_spec", "shapes_of",
]


@dataclass(frozen=True)
class GeneratedModule:
    """The compiled artefact: generated source, where it lives, and its namespace bound to sizes.

    `key` names the source (spec + layout, no sizes: one source serves every width); the namespace
    is the source executed with this model's sizes."""

    key: str
    source: str
    path: Path | None
    namespace: dict[str, Any]
    bound: BoundSpec
    from_cache: str  # where the source came from: "memory", "disk" or "built"


@dataclass
class _Entry:
    source: str
    namespaces: dict[tuple, dict[str, Any]]  # sizes -> executed module
    on_disk: set[Path] = field(default_factory=set)  # cache directories known to hold it, verified


_MEMORY: dict[str, _Entry] = {}


def cache_key(spec: Spec, bound: BoundSpec, plan: TemplatePlan | None = None) -> str:
    """Content address of the generated source: spec text (canonical) and layout, never sizes; a
    layout compiled with families (compiler.templates) is marked, so its source never mixes with
    the layer-by-layer one. The text's format is compiler.cache's."""
    templates = f"|templates v{TEMPLATES_VERSION}" if plan is not None else ""
    text = cache_key_text(f"{bound.name}|{spec.canonical()}|{bound.layout_material()}{key_material(bound)}"
                          f"{templates}")
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def compile_spec(spec: Spec, shapes: Any, *, sizes: dict[str, int] | None = None,
                 cache_dir: str | Path | None = None, disk_cache: bool = True,
                 templates: bool = True, strict: bool = True) -> GeneratedModule:
    """Run the pipeline. `shapes` is {name: shape} or an nn.Module; `sizes` sets space sizes that the
    shapes leave open (see `bind`). Nothing is cached from a failed compile. `templates=False`
    derives every layer on its own even where layers form families (the reference path of the tests).
    `strict=False` binds the spec to a subset of its parameters (see `bind`)."""
    # A deep spec allocates ~100 small objects a parameter that all live until the compile returns;
    # Python's cyclic collector would rescan them again and again (quadratic in depth, half of a
    # 1000-layer compile). Nothing here makes cycles worth collecting early.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _compile_spec(spec, shapes, sizes, cache_dir, disk_cache, templates, strict)
    finally:
        if enabled:
            gc.enable()


def _compile_spec(spec: Spec, shapes: Any, sizes: dict[str, int] | None, cache_dir: str | Path | None,
                  disk_cache: bool, templates: bool, strict: bool = True) -> GeneratedModule:
    bound = bind(spec, shapes_of(shapes), sizes, strict=strict)
    plan = template_plan(bound) if templates else None
    key = cache_key(spec, bound, plan)
    values = bound.sizes
    binding = tuple(sorted(values.items()))
    disk = _disk(cache_dir) if disk_cache else None
    entry = _MEMORY.get(key)
    path = None
    if entry is not None:
        origin = "memory"
        if disk is not None and disk.usable:  # honour this call's disk settings, not the first call's
            if disk.directory in entry.on_disk:  # verified earlier in this process: no re-read
                path = disk.path(key)
            else:
                path = disk.path(key) if disk.load(key) == entry.source else disk.store(key, entry.source)
                if path is not None:
                    entry.on_disk.add(disk.directory)
    else:
        source = disk.load(key) if disk else None
        origin = "disk"
        if source is not None:
            path = disk.path(key)
            try:
                namespace = _execute(source, path, values)
                if not all(k in namespace for k in ("gather", "scatter", "BLOCKS")):
                    raise ValueError("incomplete module")
            except Exception:  # an entry that does not load (whatever the reason): rebuild it
                source = None
        if source is None:
            source = generate_source(bound, key, plan)
            target = disk.path(key) if disk is not None and disk.usable else Path(f"<symo-generated-{key[:12]}>")
            try:  # load first: a module that fails to load is never written to the cache
                namespace = _execute(source, target, values)
            except Exception as exc:
                raise RuntimeError(f"symo: the generated code for spec {bound.name!r} does not load ({exc!r}); "
                                   "this is a bug in symo, please report it with the spec") from exc
            path = disk.store(key, source) if disk else None
            origin = "built"
        entry = _MEMORY[key] = _Entry(source, {binding: namespace})
        if path is not None:
            entry.on_disk.add(disk.directory)
    namespace = entry.namespaces.get(binding)
    if namespace is None:  # a new width for a known layout: bind the same source again
        namespace = entry.namespaces[binding] = _execute(entry.source, path or Path(f"<symo-generated-{key[:12]}>"),
                                                         values)
    return GeneratedModule(key, entry.source, path, namespace, bound, origin)


def template_plan(bound: BoundSpec) -> TemplatePlan | None:
    """The families of a layout (compiler.templates); None when a space repeats within one tensor
    (those layouts are compiled without families) or when there are none."""
    return None if has_repeated_spaces(bound) else find_families(bound)


def generate_source(bound: BoundSpec, key: str, plan: TemplatePlan | None = None) -> str:
    """compiler.codegen for specs whose spaces occur at most once per block (with one loop per
    family when `plan`, from `template_plan`, has families); compiler.codegen_repeated where a
    space repeats within one tensor (docs/repeated_spaces.md)."""
    if has_repeated_spaces(bound):
        return generate_repeated(derive_repeated(bound), key).source
    if plan is not None:
        return generate_templated(plan, key).source
    return generate(derive_structure(bound), key).source


_DISKS: dict[Path, DiskCache] = {}


def _disk(cache_dir: str | Path | None) -> DiskCache:
    """One DiskCache per directory and process, so warm compiles do not re-stat the directory."""
    path = Path(cache_dir) if cache_dir else default_cache_dir()
    if path not in _DISKS:
        _DISKS[path] = DiskCache(path)
    return _DISKS[path]


def _execute(source: str, path: Path, sizes: dict[str, int]) -> dict[str, Any]:
    filename = str(path)
    # register the text so tracebacks and inspect show generated lines even without a disk cache
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    # a real, importable module per (source, sizes): torch.compile resolves globals through sys.modules
    tag = hashlib.sha256(f"{filename}|{sorted(sizes.items())}".encode()).hexdigest()[:12]
    module = types.ModuleType(f"symo_generated_{tag}")
    module.__file__ = filename
    module.N = dict(sizes)
    exec(compile(source, filename, "exec"), module.__dict__)
    sys.modules[module.__name__] = module
    return module.__dict__
