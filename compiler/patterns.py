"""Name patterns of a spec: `{x}` captures and `*` wildcards in parameter and space-family names.

`NamePattern` matches in linear time (no regex backtracking); `substitute` fills a name's captures
with the values a parameter's pattern bound. Errors are `SpecError`s naming the file and key.
"""

from __future__ import annotations

import functools
import re

from .errors import SpecError

CAPTURE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Match:
    """What `NamePattern.fullmatch` returns: the captured values (like re.Match.groupdict)."""

    __slots__ = ("captures",)

    def __init__(self, captures: dict[str, str]) -> None:
        self.captures = captures

    def groupdict(self) -> dict[str, str]:
        return dict(self.captures)


_WILDCARD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}|\*")


class NamePattern:
    """A parameter or space-family pattern, matched in linear time (no regex backtracking).

    `{x}` captures a non-empty part of one dotted component and `*` matches any part of one (maybe
    empty); neither crosses a dot. Two wildcards must be separated by literal text (adjacent ones
    would be ambiguous), so each component matches greedily from the left: every wildcard ends at the
    first occurrence of the literal after it, or at the component's end when that literal is its
    suffix. A capture used twice must bind the same text."""

    def __init__(self, pattern: str, source: str, key: str | None = None) -> None:
        self.pattern = pattern
        self.parts: list[list[tuple[str, str]]] = []  # per component: ("lit", text) | ("cap", name) | ("star", "")
        for component in pattern.split("."):
            tokens, pos = [], 0
            for m in _WILDCARD.finditer(component):
                if m.start() > pos:
                    tokens.append(("lit", component[pos:m.start()]))
                elif tokens and tokens[-1][0] != "lit":
                    raise SpecError(f"two wildcards without text between them in {pattern!r} are ambiguous",
                                    file=source, key=key or f"params.{pattern!r}",
                                    hint="separate them with literal text, e.g. \"{a}_{b}\", or use one capture")
                tokens.append(("cap", m.group(1)) if m.group(1) else ("star", ""))
                pos = m.end()
            if pos < len(component) or not tokens:
                tokens.append(("lit", component[pos:]))
            self.parts.append(tokens)
        # components without wildcards: a name must hold them verbatim (a cheap test before matching)
        self.literals = tuple((i, tokens[0][1]) for i, tokens in enumerate(self.parts)
                              if len(tokens) == 1 and tokens[0][0] == "lit")

    def fullmatch(self, name: str) -> Match | None:
        return self.match_components(name.split("."))

    def match_components(self, components: list[str]) -> Match | None:
        """`fullmatch` on a name already split at its dots."""
        if len(components) != len(self.parts):
            return None
        for i, text in self.literals:
            if components[i] != text:
                return None
        captures: dict[str, str] = {}
        for text, tokens in zip(components, self.parts):
            if not _match_component(text, tokens, captures):
                return None
        return Match(captures)


def _match_component(text: str, tokens: list[tuple[str, str]], captures: dict[str, str]) -> bool:
    pos, k = 0, 0
    if tokens[0][0] == "lit":
        if not text.startswith(tokens[0][1]):
            return False
        pos, k = len(tokens[0][1]), 1
    while k < len(tokens):
        kind, label = tokens[k]  # a wildcard; tokens[k + 1], if any, is a literal
        least = 1 if kind == "cap" else 0
        if k + 1 == len(tokens):  # the last token: takes the rest
            end = len(text)
            nxt = len(text)
        elif k + 2 == len(tokens):  # followed by the suffix
            suffix = tokens[k + 1][1]
            if not text.endswith(suffix):
                return False
            end = len(text) - len(suffix)
            nxt = len(text)
        else:
            end = text.find(tokens[k + 1][1], pos + least)
            if end < 0:
                return False
            nxt = end + len(tokens[k + 1][1])
        if end - pos < least:
            return False
        if kind == "cap":
            value = text[pos:end]
            if captures.setdefault(label, value) != value:
                return False
        pos, k = nxt, k + 2
    return pos == len(text)


def substitute(name: str, caps: dict[str, str], source: str, key: str, param: str | None = None,
               axis: int | None = None) -> str:
    """`name` with each `{x}` replaced by the captured value `caps[x]`; a capture the pattern did not
    bind is a SpecError at `key`."""
    parts = _template(name)
    if len(parts) == 1:
        return name
    out = [parts[0]]
    for k in range(1, len(parts), 2):
        value = caps.get(parts[k])
        if value is None:
            raise _uncaptured(name, parts[k], source, key, param, axis)
        out += (value, parts[k + 1])
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def _template(name: str) -> list[str]:
    """`name` split at its captures: [text, capture, text, capture, ..., text]."""
    return CAPTURE.split(name)


def _uncaptured(name: str, capture: str, source: str, key: str, param: str | None, axis: int | None) -> SpecError:
    cap = "{" + capture + "}"
    if key.endswith(".per"):  # a family's owner can only reuse the family's own captures
        hint = f"capture it in the space's name too, e.g. \"dqk{cap}\" = {{ per = \"head{cap}\" }}"
    else:
        hint = f"capture it in the parameter pattern, e.g. \"layers.{cap}.weight\""
    return SpecError(f"{cap} in {name!r} is not captured by the pattern", file=source, key=key, param=param,
                     axis=axis, hint=hint)
