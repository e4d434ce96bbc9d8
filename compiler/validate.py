"""Stage 2, validate: `Spec` + parameter shapes -> `BoundSpec`.

Matches parameter patterns against the model's names, instantiates space families, infers the sizes
of spaces and free segments from the shapes, and cuts every parameter into *blocks*: one block per
choice of segment on each fused axis, each block a sub-tensor whose axes are atoms (one space or one
free axis each). A networkx multigraph holds the incidence of spaces and blocks; it decides what
couples with what and finds repeated spaces (tier 2, `compiler.tier2`).
"""

from __future__ import annotations

import difflib
import itertools
import math
import operator
import re
import unicodedata
from collections.abc import Mapping

import networkx as nx

from .bound import Atom, Block, BoundParam, BoundSpace, BoundSpec
from .errors import SpecError, few, short
from .parse import FREE, SpaceDecl, Spec, bundled_specs
from .sizes import AxisEquation, solve_sizes
from .tier2 import check_repeated

_CAPTURE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def shapes_of(model_or_shapes: object) -> dict[str, tuple[int, ...]]:
    """Accept {name: shape} or an nn.Module (its named_parameters, in order); check names and shapes.

    A shape is a sequence of non-negative ints (tuple, list, torch.Size) or anything with `.shape`.
    Names must be printable strings, distinct after Unicode normalisation (NFKC)."""
    named = getattr(model_or_shapes, "named_parameters", None)
    if callable(named):
        items = [(n, tuple(p.shape)) for n, p in named()]
    elif isinstance(model_or_shapes, Mapping):
        items = list(model_or_shapes.items())
    else:
        raise TypeError("shapes must be a dict {name: shape} or an nn.Module, got "
                        f"{type(model_or_shapes).__name__}")
    out: dict[str, tuple[int, ...]] = {}
    folded: dict[str, str] = {}
    for name, shape in items:
        if not isinstance(name, str):
            raise TypeError(f"shapes: parameter names must be str, got {short(repr(name))} "
                            f"({type(name).__name__})")
        if not name or not name.isprintable():
            raise ValueError(f"shapes: parameter name {short(repr(name))} is empty or holds control or "
                             "non-printable characters; rename the parameter")
        key = unicodedata.normalize("NFKC", name)
        if key in folded:
            raise ValueError(f"shapes: parameter names {short(folded[key])!r} and {short(name)!r} are the same "
                             "after Unicode normalisation (NFKC); rename one of them")
        folded[key] = name
        out[name] = _shape(name, shape)
    return out


def _shape(name: str, shape: object) -> tuple[int, ...]:
    shape = getattr(shape, "shape", shape)
    if not isinstance(shape, (tuple, list)):  # torch.Size is a tuple
        raise TypeError(f"shapes[{short(name)!r}] must be a tuple of ints such as (16, 8), got "
                        f"{short(repr(shape))} ({type(shape).__name__})")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"shapes[{short(name)!r}] must hold ints, got {short(repr(d))} ({type(d).__name__})")
        if operator.index(d) < 0:
            raise ValueError(f"shapes[{short(name)!r}] has a negative dimension {d}")
        dims.append(operator.index(d))
    return tuple(dims)


def bind(spec: Spec, shapes: Mapping[str, tuple[int, ...]], sizes: Mapping[str, int] | None = None, *,
         strict: bool = True) -> BoundSpec:
    """Bind `spec` to parameter `shapes`; raise `SpecError` on any inconsistency.

    `sizes` overrides or supplies space sizes, keyed by a declared name (a family such as `head{i}`
    sets every instance) or by an instance name (`head3`); the shapes cannot always tell them apart
    (n_head x d_head is one axis).

    `strict=False` binds a spec to a subset of the parameters it was written for (fine-tuning part of
    a model): a rule that matches no parameter is dropped, as a `?` rule is, and so are the spaces and
    blocks that then have no parameter, and `sizes` for such spaces are ignored. Everything that does
    match is checked as strictly as before."""
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, got {strict!r}")
    # a rule whose key starts with "?" is optional: matching nothing is fine (e.g. biases of a
    # bias-free model); every other rule must match at least one parameter
    optional = {r.pattern: r.pattern.startswith("?") for r in spec.params}
    rules = [(r, _pattern_regex(r.pattern.removeprefix("?"), spec.source, f"params.{r.pattern!r}"))
             for r in spec.params]
    matched: dict[str, tuple] = {}
    hits = {r.pattern: 0 for r in spec.params}
    for name in shapes:
        found = [(r, m) for r, rx in rules if (m := rx.fullmatch(name))]
        if len(found) > 1:
            keys = [f"params.{r.pattern!r}" for r, _ in found]
            raise SpecError(f"parameter matches several rules: {few(keys, 4)}", file=spec.source, key=keys[0],
                            param=name, hint="make the patterns disjoint so each parameter has one rule")
        if found:
            r, m = found[0]
            hits[r.pattern] += 1
            matched[name] = (r, m.groupdict())
    for pattern, n in hits.items():
        if n == 0 and not optional[pattern] and strict:
            close = difflib.get_close_matches(pattern.replace("{", "").replace("}", ""), list(shapes), 3, 0.3)
            raise SpecError("pattern matches no parameter of the model", file=spec.source,
                            key=f"params.{pattern!r}",
                            hint=(f"check the name; parameters that look similar: {close}" if close
                                  else "check the name against model.named_parameters()")
                            + "; to use the spec for a subset of the parameters (fine-tuning part of a model), "
                              "pass strict=False (CLI: --partial)" + _own_model_hint(spec))
    if not strict and not matched:
        raise SpecError("no rule of the spec matches any parameter given", file=spec.source, key="params",
                        hint=f"check the names against the parameters, e.g. {few(list(shapes), 4)}"
                        + _own_model_hint(spec))

    decls = {d.name: d for d in spec.spaces}
    families = [(d, _pattern_regex(d.name, spec.source, f"spaces.{d.name}")) for d in spec.spaces if "{" in d.name]
    resolved: dict[str, tuple[SpaceDecl, dict]] = {}

    def resolve(space: str, key: str, param: str, axis: int, owner_of: str | None = None) -> None:
        if space in resolved and owner_of is None:
            return
        if space in decls:
            resolved[space] = (decls[space], {})
        else:
            for d, rx in families:
                if m := rx.fullmatch(space):
                    resolved[space] = (d, m.groupdict())
                    break
            else:
                raise SpecError(f"space {short(space)!r} is not declared", file=spec.source, key=key,
                                param=param, axis=axis,
                                hint=f"declare it under [spaces] (declared: {few(decls)})")
        d, caps = resolved[space]
        if d.per is not None and owner_of is not None:  # checked here, so a per chain never recurses
            raise SpecError(f"owner {space!r} of {owner_of!r} is itself declared per another space",
                            file=spec.source, key=key, hint="nest at most one level of per")
        if d.per is not None:
            owner = _substitute(d.per, caps, spec.source, f"spaces.{d.name}.per", param, axis)
            if owner == space:
                raise SpecError(f"space {space!r} is declared per itself", file=spec.source,
                                key=f"spaces.{d.name}.per", hint="per must name a different, identity space")
            resolve(owner, f"spaces.{d.name}.per", param, axis, owner_of=space)

    # Instantiate each covered parameter's axes: concrete space names per segment.
    concrete: dict[str, list[list[tuple[str, ...]]]] = {}
    for name, (rule, caps) in matched.items():
        key = f"params.{rule.pattern!r}"
        if len(rule.axes) != len(shapes[name]):
            raise SpecError(f"the rule lists {len(rule.axes)} axes but the tensor has shape "
                            f"{tuple(shapes[name])} ({len(shapes[name])} axes)", file=spec.source,
                            key=key, param=name, hint="give exactly one entry per tensor axis")
        axes = []
        for a, segs in enumerate(rule.axes):
            out = []
            for seg in segs:
                atoms = tuple(_substitute(x, caps, spec.source, key, name, a) for x in seg)
                for x in atoms:
                    if x != FREE:
                        resolve(x, key, name, a)
                out.append(atoms)
            axes.append(out)
        concrete[name] = axes

    sizes = sizes or {}
    if not strict and isinstance(sizes, Mapping):  # sizes of spaces the dropped rules used: nothing to set
        known = set(resolved) | {d.name for d, _ in resolved.values()}
        sizes = {k: v for k, v in sizes.items() if k in known}
    sizes = _infer_sizes(spec, resolved, matched, concrete, shapes, sizes)
    spaces: dict[str, BoundSpace] = {}
    taken: set[str] = set()  # symbols given so far (a set kept up to date: rebuilding it is quadratic in depth)
    for s in sorted(resolved, key=lambda s: _decl_order(spec, resolved[s][0], s)):
        d, caps = resolved[s]
        per = _substitute(d.per, caps, spec.source, "", None, None) if d.per else None
        if per is not None and resolved[per][0].group != "identity":
            raise SpecError(f"space {s!r} is declared per {per!r}, whose group is "
                            f"{resolved[per][0].group!r}; only an identity owner is supported",
                            file=spec.source, key=f"spaces.{d.name}.per",
                            hint=f"declare {per!r} with group = \"identity\"")
        if per is not None and resolved[per][0].per is not None:
            raise SpecError(f"owner {per!r} of {s!r} is itself declared per another space",
                            file=spec.source, key=f"spaces.{d.name}.per",
                            hint="nest at most one level of per")
        spaces[s] = BoundSpace(name=s, group=d.group, size=sizes[s], per=per, decl=d.name,
                               symbol=_symbol_name(s, taken))
        taken.add(spaces[s].symbol)

    params, graph = [], nx.MultiGraph()
    graph.add_nodes_from(("space", s) for s in spaces)
    for pi, (name, axes) in enumerate(concrete.items()):
        rule = matched[name][0]
        p = _cut_blocks(name, pi, shapes[name], axes, sizes, spaces, f"params.{rule.pattern!r}")
        for b in p.blocks:
            node = ("block", name, b.index)
            graph.add_node(node)
            graph.add_edges_from((node, ("space", a.space)) for a in b.atoms if a.space is not None)
            # the incidence multigraph decides: two edges between a block and a space = a repeated
            # space, compiled by tier 2 (docs/theory.md), which rejects what it cannot compile
            for space in sorted({space for _, (_, space) in graph.edges(node)}):
                count = graph.number_of_edges(node, ("space", space))
                if count > 1:
                    check_repeated(spec.source, f"params.{rule.pattern!r}", name, spaces[space], count, spaces,
                                   [a.space for a in b.atoms if a.space is not None])
            seen = {space for _, (_, space) in graph.edges(node)}
            for atom in b.atoms:
                owner = spaces[atom.space].per if atom.space else None
                if owner is not None and owner not in seen:
                    raise SpecError(f"space {atom.space!r} is declared per {owner!r}, but this block "
                                    f"has no {owner!r} axis to say which group element acts",
                                    file=spec.source, key=f"params.{rule.pattern!r}", param=name,
                                    hint=f"write the axis as a product, e.g. \"({owner} {atom.space})\"")
        params.append(p)
    uncovered = tuple((n, tuple(s)) for n, s in shapes.items() if n not in matched)
    order = {n: i for i, n in enumerate(shapes)}
    params.sort(key=lambda p: order[p.name])
    return BoundSpec(name=spec.name, source=spec.source, spaces=spaces, params=tuple(params),
                     uncovered=uncovered, graph=graph)


def _decl_order(spec: Spec, decl: SpaceDecl, name: str) -> tuple:
    i = [d.name for d in spec.spaces].index(decl.name)
    # families: order instances numerically where the captures are numbers (h2 before h10)
    return (i, [int(t) if t.isdecimal() else t for t in re.split(r"(\d+)", name)])  # "²".isdigit(), not int()


class _Match:
    """What `_NamePattern.fullmatch` returns: the captured values (like re.Match.groupdict)."""

    __slots__ = ("captures",)

    def __init__(self, captures: dict[str, str]) -> None:
        self.captures = captures

    def groupdict(self) -> dict[str, str]:
        return dict(self.captures)


_WILDCARD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}|\*")


class _NamePattern:
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

    def fullmatch(self, name: str) -> _Match | None:
        components = name.split(".")
        if len(components) != len(self.parts):
            return None
        captures: dict[str, str] = {}
        for text, tokens in zip(components, self.parts):
            if not _match_component(text, tokens, captures):
                return None
        return _Match(captures)


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


def _own_model_hint(spec: Spec) -> str:
    """For a bundled spec: it names the parameters of the model it was written for, so point a user with a
    model of their own to `symo infer`, which writes a spec from the model (Muon-style with --relax muon)."""
    name = next((n for n, path in bundled_specs().items() if str(path) == spec.source), None)
    if name is None:
        return ""
    return (f". The bundled spec {name!r} fits the parameter names of the model it was written for (README, "
            "\"Bundled specs\"); for a model of your own, `symo infer --model module:factory -o spec.toml` writes "
            "its spec (`symo infer --relax muon ...` the Muon-style one: a private row space per hidden matrix), "
            "or in Python symo.infer_spec(model, example_inputs, relax=\"muon\")")


def _pattern_regex(pattern: str, source: str, key: str | None = None) -> _NamePattern:
    """The matcher of a pattern (kept under its old name: callers use `.fullmatch(name).groupdict()`)."""
    return _NamePattern(pattern, source, key)


def _substitute(name: str, caps: dict, source: str, key: str, param: str | None, axis: int | None) -> str:
    def sub(m: re.Match) -> str:
        if m.group(1) not in caps:
            cap = "{" + m.group(1) + "}"
            if key.endswith(".per"):  # a family's owner can only reuse the family's own captures
                hint = f"capture it in the space's name too, e.g. \"dqk{cap}\" = {{ per = \"head{cap}\" }}"
            else:
                hint = f"capture it in the parameter pattern, e.g. \"layers.{cap}.weight\""
            raise SpecError(f"{cap} in {name!r} is not captured by the pattern", file=source, key=key,
                            param=param, axis=axis, hint=hint)
        return caps[m.group(1)]

    return _CAPTURE.sub(sub, name)


def _infer_sizes(spec, resolved, matched, concrete, shapes, given) -> dict[str, int]:
    """Solve sum_seg prod_atoms size = axis length, jointly over every axis (compiler.sizes)."""
    known_names = set(resolved) | {d.name for d, _ in resolved.values()}
    if not isinstance(given, Mapping):
        raise TypeError(f"sizes must be a dict {{space: int}}, got {type(given).__name__}")
    for name, value in given.items():
        if not isinstance(name, str):
            raise TypeError(f"sizes: keys must be space names (str), got {name!r}")
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"sizes[{short(name)!r}] must be an int, got {type(value).__name__}")
        if name not in known_names:
            raise SpecError(f"a size is given for {short(name)!r}, which no covered parameter uses",
                            file=spec.source, key=f"spaces.{short(name)}",
                            hint=f"sizes can be set for {few(sorted(known_names))}")
        if value < 1:
            raise SpecError(f"size for {name!r} must be a positive integer, got {value!r}",
                            file=spec.source, key=f"spaces.{name}", hint="e.g. sizes={'head': 4}")
    sizes: dict[str, int] = {}
    for s, (d, _) in resolved.items():
        value = given.get(s, given.get(d.name, d.size))
        if value is not None:
            sizes[s] = value
    # one equation per matched axis; free segments get a private unknown
    eqs = []
    for name, axes in concrete.items():
        for a, segs in enumerate(axes):
            terms = tuple(tuple(f"_:{name}:{a}:{j}" if x == FREE else x for x in seg) for j, seg in enumerate(segs))
            eqs.append(AxisEquation(name, a, f"params.{matched[name][0].pattern!r}", terms, shapes[name][a]))
    return solve_sizes(eqs, sizes, spec.source, {s: d.name for s, (d, _) in resolved.items()})


def _symbol_name(space: str, taken: set[str]) -> str:
    # a plain ASCII identifier names its symbol (n_h1, n_head3); any other instance name (captured
    # from arbitrary parameter text) gets a numbered one, so no input text reaches an identifier
    base = f"n_{space}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", space) else f"n_space{len(taken)}"
    name, k = base, 1
    while name in taken:  # two instance names that sanitise alike
        name, k = f"{base}_{k}", k + 1
    return name


def _cut_blocks(name, pi, shape, axes, sizes, spaces, key) -> BoundParam:
    per_axis = []  # for each axis: list of (start, length, atoms)
    for a, segs in enumerate(axes):
        opts, start = [], 0
        for j, seg in enumerate(segs):
            atoms = tuple(Atom(None, sizes[f"_:{name}:{a}:{j}"], f"f{pi}_{a}_{j}") if x == FREE
                          else Atom(x, sizes[x], spaces[x].symbol) for x in seg)
            length = math.prod(at.size for at in atoms)
            opts.append((start, length, atoms))
            start += length
        per_axis.append(opts)
    blocks = []
    for i, choice in enumerate(itertools.product(*per_axis)):
        blocks.append(Block(param=name, index=i, slices=tuple((s, n) for s, n, _ in choice),
                            axes=tuple(atoms for _, _, atoms in choice)))
    fused = tuple(a for a, opts in enumerate(per_axis) if len(opts) > 1)
    return BoundParam(name=name, shape=tuple(shape), rule=key, blocks=tuple(blocks), fused_axes=fused)
