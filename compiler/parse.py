"""Stage 1, parse: TOML text -> `Spec`, a syntax tree with no knowledge of any model.

Grammar (documented for users in README.md, "The spec format"):

    [spaces]   name = { group = "perm" | "signed_perm" | "orthogonal" | "identity",
                        size = 64 (optional), per = "owner" (optional) }
    [params]   "pattern" = [axis, axis, ...]
               axis    = segment | [segment, segment, ...]    (a list is a fused axis)
               segment = "_" | "space" | "(space space ...)"  (a product, row-major)

Names may hold `{x}` captures; a parameter pattern binds them and the spaces it names reuse them.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
import unicodedata
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .errors import SpecError, did_you_mean, few, short

GROUPS = ("identity", "perm", "signed_perm", "orthogonal")
FREE = "_"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:\{[A-Za-z_][A-Za-z0-9_]*\}[A-Za-z0-9_]*)*|\{[A-Za-z_][A-Za-z0-9_]*\}[A-Za-z0-9_{}]*"
_NAME_RE = re.compile(rf"^(?:{_NAME})\Z")  # \Z: "$" would accept a trailing newline
_SPACE_KEYS = {"group", "size", "per"}
_TOP_KEYS = {"name", "description", "spaces", "params"}
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # all but tab, newline, return
MAX_SPEC_BYTES = 1 << 20  # far beyond any real spec; a larger file is a mistake (or not a spec)


@dataclass(frozen=True)
class SpaceDecl:
    """One `[spaces]` entry; `name` may be a family such as `h{i}`."""

    name: str
    group: str
    size: int | None
    per: str | None


# A segment is a product of atoms ("_" or a space name); an axis is a tuple of fused segments.
Segment = tuple[str, ...]
AxisExpr = tuple[Segment, ...]


@dataclass(frozen=True)
class ParamRule:
    """One `[params]` entry: a name pattern and the space expression of each axis."""

    pattern: str
    axes: tuple[AxisExpr, ...]


@dataclass(frozen=True)
class Spec:
    """A parsed spec file. `source` is the file path (or "<string>") used in every error message."""

    name: str
    spaces: tuple[SpaceDecl, ...]
    params: tuple[ParamRule, ...]
    source: str = "<string>"

    def canonical(self) -> str:
        """A text that is equal for equal specs whatever their formatting: the cache key's input."""
        spaces = ";".join(f"{s.name}={s.group},{s.size},{s.per}" for s in self.spaces)
        params = ";".join(f"{r.pattern}={r.axes!r}" for r in self.params)
        return f"spaces[{spaces}]params[{params}]"

    def to_toml(self, header: str = "") -> str:
        """The spec as TOML text that `parse_spec` reads back to an equal spec; `header` becomes comments."""
        return spec_to_toml(self, header)


def bundled_specs() -> dict[str, Path]:
    """The specs shipped with Symo (package `symo.specs`), by name: {"gpt_muon": path, ...}."""
    root = resources.files("symo.specs")
    return {Path(str(f)).stem: Path(str(f)) for f in root.iterdir() if str(f).endswith(".toml")}


class SpecShadowWarning(UserWarning):
    """A file in the current folder has the name of a bundled spec, and is used in its place."""


def resolve_spec_path(path: str | Path) -> Path:
    """An existing file wins; otherwise a bare name ("gpt_muon" or "gpt_muon.toml") names a bundled spec.

    A bare name that is both a file here and a bundled spec reads the file, with a `SpecShadowWarning`
    naming both (give "./NAME" to mean the file and silence it). A folder (or anything but a file)
    named like a bundled spec never hides it: a folder cannot be a spec."""
    text = os.fspath(path)
    if "\0" in str(text):
        raise SpecError("the path contains a NUL byte, which no file name can hold", file=short(repr(text)),
                        hint="check how the path was built (a NUL often marks the end of a C string)")
    path = Path(path)
    try:
        exists, is_file = path.exists(), path.is_file()
    except OSError as exc:  # e.g. ENAMETOOLONG: exists() lets it through
        raise SpecError(f"cannot use the path ({exc.strerror or exc}; {len(str(text)):,} characters)",
                        file=short(str(text)), hint="check the path: a spec file, or a bundled spec name "
                        "such as 'gpt_muon'") from None
    bundled = bundled_specs() if len(path.parts) == 1 and not str(text).startswith(".") else {}
    name = path.stem if path.suffix == ".toml" else path.name
    if name in bundled and is_file and path.resolve() != bundled[name].resolve():  # (from specs/: the same file)
        warnings.warn(f"spec {str(text)!r}: reading the file {short(str(path.resolve()), 200)}, not the bundled "
                      f"spec {name!r} of the same name (give ./{short(str(text))} to mean the file and silence "
                      "this warning, or rename the file)", SpecShadowWarning, stacklevel=3)
        return path
    if exists and (is_file or name not in bundled):
        return path
    return bundled.get(name, path)


def _read_spec_bytes(path: Path) -> bytes:
    """The file's bytes, read with the size bound applied while reading: a FIFO, a device such as
    /dev/zero, a socket or a folder is refused by its type (never opened for a blocking read), and a file
    longer than MAX_SPEC_BYTES is refused after reading one byte more than the bound."""
    names = ", ".join(sorted(bundled_specs()))
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        near = did_you_mean(Path(path).stem, bundled_specs()) if len(Path(path).parts) == 1 else ""
        raise SpecError(f"cannot read the spec file ({exc.strerror or exc}){near}", file=short(str(path)),
                        hint=f"check the path, or name a bundled spec: {names}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise SpecError(f"the path is {kind}, not a spec file", file=short(str(path)),
                        hint=f"give a TOML spec file, or name a bundled spec: {names}")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as fh:  # buffered: read(n) returns n bytes unless the file ends first
        data = fh.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"the file is larger than any spec (more than {MAX_SPEC_BYTES:,} bytes)", file=str(path),
                        hint="check that the path names a TOML spec file")
    return data


def load_spec(path: str | Path) -> Spec:
    """Read and parse a spec file, given by path or by the name of a bundled spec ("gpt_muon")."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"load_spec: path must be a str or os.PathLike (a file, or a bundled spec name such as "
                        f"'gpt_muon'), got {type(path).__name__}")
    path = resolve_spec_path(path)
    data = _read_spec_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})", file=str(path),
                        hint="save the spec as UTF-8 (TOML requires it); check that the path names a spec") from None
    return parse_spec(text, source=str(path))


def parse_spec(text: str, source: str = "<string>") -> Spec:
    """Parse TOML spec text. Raises `SpecError` naming `source` and the offending key."""
    if not isinstance(text, str):
        hint = " (decode bytes first, or use load_spec for a file)" if isinstance(text, (bytes, bytearray)) else ""
        raise TypeError(f"parse_spec: text must be a str of TOML, got {type(text).__name__}{hint}")
    if not isinstance(source, str):
        raise TypeError(f"parse_spec: source must be a str, got {type(source).__name__}")
    text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark, as some editors write: not part of the TOML
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"the spec text has {len(text):,} characters, more than any spec ({MAX_SPEC_BYTES:,})",
                        file=source, hint="check that the text is a spec")
    if m := _CONTROL.search(text):
        line = text.count("\n", 0, m.start()) + 1
        raise SpecError(f"control character {m.group()!r} at line {line}", file=source,
                        hint="remove it; a spec is plain text (a binary file is not a spec)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"TOML syntax error: {exc}", file=source,
                        hint="fix the TOML at the line and column given") from exc
    except RecursionError:
        raise SpecError("nesting too deep for a spec", file=source,
                        hint="a spec nests at most a list of lists (a fused axis)") from None
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise SpecError(f"unknown top-level key(s) {few(unknown)}{did_you_mean(unknown[0], _TOP_KEYS)}", file=source,
                        key=short(unknown[0]),
                        hint=f"allowed top-level keys are {sorted(_TOP_KEYS)}")
    name = data.get("name", Path(source).stem if source != "<string>" else "spec")
    if not isinstance(name, str) or not name.isprintable():
        raise SpecError("`name` must be a one-line string", file=source, key="name", hint='name = "my model"')
    if not isinstance(data.get("description", ""), str):
        raise SpecError("`description` must be a string", file=source, key="description",
                        hint='description = "what the spec is for"')
    spaces = _parse_spaces(data.get("spaces", {}), source)
    if "params" not in data or not data["params"]:
        raise SpecError("the spec has no [params] table", file=source, key="params",
                        hint='add e.g. [params]\n  "fc1.weight" = ["h", "_"]')
    params = _parse_params(data["params"], source)
    return Spec(name=name, spaces=spaces, params=params, source=source)


def _parse_spaces(table: object, source: str) -> tuple[SpaceDecl, ...]:
    if not isinstance(table, dict):
        raise SpecError("[spaces] must be a table", file=source, key="spaces",
                        hint='write [spaces] then lines like h = { group = "perm" }')
    out = []
    for name, entry in table.items():
        key = f"spaces.{short(name)}"
        if not _NAME_RE.match(name) or name == FREE:
            raise SpecError(f"{short(name)!r} is not a valid space name", file=source, key=key,
                            hint="use letters, digits and _, optionally with {x} captures, e.g. h{i}")
        if isinstance(entry, str):  # shorthand: h = "perm"
            entry = {"group": entry}
        if not isinstance(entry, dict):
            raise SpecError("a space must be a table or a group name", file=source, key=key,
                            hint=f'{name} = {{ group = "perm" }}')
        extra = sorted(set(entry) - _SPACE_KEYS)
        if extra:
            raise SpecError(f"unknown field(s) {few(extra)}{did_you_mean(extra[0], _SPACE_KEYS)}", file=source,
                            key=key, hint=f"a space takes only {sorted(_SPACE_KEYS)}")
        group = entry.get("group")
        if group not in GROUPS:
            raise SpecError(f"unknown group {short(repr(group))}{did_you_mean(group, GROUPS)}", file=source,
                            key=f"{key}.group",
                            hint=f"use one of {list(GROUPS)}")
        size = entry.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise SpecError(f"size must be a positive integer, got {short(repr(size))}", file=source,
                            key=f"{key}.size", hint="give the size as an integer, or leave it out "
                            "to infer it from the parameter shapes")
        per = entry.get("per")
        if per is not None and (not isinstance(per, str) or not _NAME_RE.match(per)):
            raise SpecError(f"per must name another space, got {short(repr(per))}", file=source,
                            key=f"{key}.per", hint='per = "head"')
        if per == name:
            raise SpecError(f"space {name!r} is declared per itself", file=source, key=f"{key}.per",
                            hint="per must name a different space (e.g. the head index)")
        out.append(SpaceDecl(name=name, group=group, size=size, per=per))
    return tuple(out)


def _parse_params(table: object, source: str) -> tuple[ParamRule, ...]:
    if not isinstance(table, dict):
        raise SpecError("[params] must be a table", file=source, key="params",
                        hint='"fc1.weight" = ["h", "_"]')
    rules, normal = [], {}
    for pattern, axes in table.items():
        key = f"params.{pattern!r}"
        if not pattern or not pattern.isprintable() or pattern != pattern.strip():
            raise SpecError(f"{short(pattern)!r} is not a valid parameter name or pattern", file=source,
                            key=f"params.{short(pattern)!r}",
                            hint="names are printable text without control characters or outer spaces")
        if pattern.startswith("?") and not pattern[1:].strip():
            # "?" marks a rule optional; alone it would be a rule that silently matches nothing
            raise SpecError(f"{pattern!r} is the optional-rule marker with no pattern after it", file=source,
                            key=key, hint='write "?" before a pattern, e.g. "?fc{i}.bias", or quote a parameter '
                            "named like this under another pattern")
        folded = unicodedata.normalize("NFKC", pattern)
        if folded in normal:
            raise SpecError(f"{short(pattern)!r} and {short(normal[folded])!r} are the same name after "
                            "Unicode normalisation (NFKC)", file=source, key=f"params.{short(pattern)!r}",
                            hint="write each parameter name once, in one spelling")
        normal[folded] = pattern
        if not isinstance(axes, list) or not axes:
            raise SpecError("a parameter entry must be a non-empty list with one entry per axis",
                            file=source, key=key, param=pattern,
                            hint='e.g. ["h", "_"] for a weight whose rows carry space h')
        parsed = []
        for i, axis in enumerate(axes):
            segments = axis if isinstance(axis, list) else [axis]
            if not segments:
                raise SpecError("a fused axis needs at least one segment", file=source, key=key,
                                param=pattern, axis=i, hint='["(head dqk)", "(head dqk)"]')
            parsed.append(tuple(_parse_segment(s, source, key, pattern, i) for s in segments))
        rules.append(ParamRule(pattern=pattern, axes=tuple(parsed)))
    return tuple(rules)


def _parse_segment(text: object, source: str, key: str, pattern: str, axis: int) -> Segment:
    if not isinstance(text, str):
        raise SpecError(f"an axis entry must be a string, got {short(repr(text))}", file=source, key=key,
                        param=pattern, axis=axis, hint='use "_", "space" or "(space1 space2)"')
    body = text.strip()
    if body.startswith("("):
        if not body.endswith(")"):
            raise SpecError(f"unbalanced parentheses in {short(repr(text))}", file=source, key=key,
                            param=pattern, axis=axis, hint='write products as "(head dqk)"')
        atoms = tuple(body[1:-1].split())
        if not atoms:
            raise SpecError("an empty product '()'", file=source, key=key, param=pattern, axis=axis,
                            hint='list the spaces inside, e.g. "(head dqk)"')
    else:
        atoms = (body,)
    for atom in atoms:
        if atom == FREE:
            if len(atoms) > 1:
                raise SpecError(f"'_' inside a product {short(repr(text))}", file=source, key=key,
                                param=pattern, axis=axis,
                                hint="declare an identity space for that factor instead of '_'")
        elif not _NAME_RE.match(atom):
            raise SpecError(f"{short(repr(atom))} is not a space name", file=source, key=key, param=pattern,
                            axis=axis, hint='use "_", "space" or "(space1 space2)"')
    return atoms


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spec_to_toml(spec: Spec, header: str = "") -> str:
    """Serialise a `Spec` (the inverse of `parse_spec`): segments as "_", "space" or "(a b)", fused axes as lists."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"name = {_toml_str(spec.name)}", "", "[spaces]"]
    for s in spec.spaces:
        fields = [f"group = {_toml_str(s.group)}"]
        if s.per is not None:
            fields.append(f"per = {_toml_str(s.per)}")
        if s.size is not None:
            fields.append(f"size = {s.size}")
        lines.append(f"{_toml_str(s.name)} = {{ {', '.join(fields)} }}")
    lines += ["", "[params]"]
    for rule in spec.params:
        axes = []
        for axis in rule.axes:
            segs = [_toml_str(seg[0] if len(seg) == 1 else "(" + " ".join(seg) + ")") for seg in axis]
            axes.append(segs[0] if len(segs) == 1 else "[" + ", ".join(segs) + "]")
        lines.append(f"{_toml_str(rule.pattern)} = [{', '.join(axes)}]")
    return "\n".join(lines) + "\n"
