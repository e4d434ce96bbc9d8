"""Stage 2, bind: `Spec` + parameter shapes -> `BoundSpec`.

`bind` runs five steps, each a function below:

1. `_match_rules`: every parameter to the one rule whose pattern matches it (patterns of
   compiler.patterns, pre-filtered by their literal components);
2. `_instantiate_axes`: each matched parameter's axes as concrete space names, the space families
   (`h{i}`) instantiated;
3. `_infer_sizes`: the sizes of spaces and free segments from the shapes, solved jointly
   (compiler.sizes);
4. `_bind_spaces`: the spaces with their sizes, owners and size names (compiler.size_names);
5. `_cut_params`: every parameter cut into *blocks*, one per choice of segment on each fused axis,
   each a sub-tensor whose axes are atoms (one space or one free axis each), with the checks a block
   needs (a space repeated in it, a per-space without its owner).
"""

from __future__ import annotations

import difflib
import itertools
import math
import operator
import re
import unicodedata
from collections.abc import Mapping

from .bound import Atom, Block, BoundParam, BoundSpace, BoundSpec
from .errors import SpecError, few, short
from .parse import FREE, ParamRule, SpaceDecl, Spec, bundled_specs
from .patterns import NamePattern, substitute
from .size_names import free_symbol, parameter_stem, space_symbol
from .sizes import AxisEquation, solve_sizes


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
    if type(shape) is tuple and all(type(d) is int and d >= 0 for d in shape):
        return shape  # the common case, checked without the general path's per-entry calls
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
    match is checked as strictly as with `strict=True`."""
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, got {strict!r}")
    matched = _match_rules(spec, shapes, strict)
    resolved, concrete = _instantiate_axes(spec, matched, shapes)
    given = sizes or {}
    if not strict and isinstance(given, Mapping):  # sizes of spaces the dropped rules used: nothing to set
        known = set(resolved) | {d.name for d, _ in resolved.values()}
        given = {k: v for k, v in given.items() if k in known}
    solved = _infer_sizes(spec, resolved, matched, concrete, shapes, given)
    spaces = _bind_spaces(spec, resolved, solved)
    params = _cut_params(spec, matched, concrete, shapes, solved, spaces)
    uncovered = tuple((n, tuple(s)) for n, s in shapes.items() if n not in matched)
    return BoundSpec(name=spec.name, source=spec.source, spaces=spaces, params=params, uncovered=uncovered)


def _match_rules(spec: Spec, shapes: Mapping[str, tuple[int, ...]],
                 strict: bool) -> dict[str, tuple[ParamRule, dict[str, str]]]:
    """name -> (its rule, the rule's captures), in the model's order. Every rule must match (a `?`
    rule, or any rule with strict=False, may match nothing); no parameter may match two."""
    # candidates by (number of components, last component if it has no wildcard): a deep model has
    # thousands of names and a spec a few rules, most of which a name's last component rules out
    index: dict[tuple[int, str | None], list[tuple[ParamRule, NamePattern]]] = {}
    for r in spec.params:
        pattern = NamePattern(r.pattern.removeprefix("?"), spec.source, f"params.{r.pattern!r}")
        last = pattern.parts[-1]
        index.setdefault((len(pattern.parts), last[0][1] if len(last) == 1 and last[0][0] == "lit" else None),
                         []).append((r, pattern))
    matched: dict[str, tuple[ParamRule, dict[str, str]]] = {}
    hits = dict.fromkeys((r.pattern for r in spec.params), 0)
    for name in shapes:
        components = name.split(".")
        candidates = index.get((len(components), components[-1]), []) + index.get((len(components), None), [])
        found = [(r, m) for r, pattern in candidates if (m := pattern.match_components(components))]
        if len(found) > 1:
            keys = [f"params.{r.pattern!r}" for r, _ in found]
            raise SpecError(f"parameter matches several rules: {few(keys, 4)}", file=spec.source, key=keys[0],
                            param=name, hint="make the patterns disjoint so each parameter has one rule")
        if found:
            r, m = found[0]
            hits[r.pattern] += 1
            matched[name] = (r, m.captures)
    for pattern, n in hits.items():
        # a rule whose key starts with "?" is optional: matching nothing is fine (e.g. biases of a
        # bias-free model); every other rule must match at least one parameter
        if n == 0 and not pattern.startswith("?") and strict:
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
    return matched


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


def _instantiate_axes(spec: Spec, matched: dict, shapes: Mapping) -> tuple[dict, dict]:
    """The spaces the matched parameters use, as (declaration, captures) by instance name, and each
    parameter's axes as concrete space names per segment."""
    decls = {d.name: d for d in spec.spaces}
    families = [(d, NamePattern(d.name, spec.source, f"spaces.{d.name}")) for d in spec.spaces if "{" in d.name]
    resolved: dict[str, tuple[SpaceDecl, dict]] = {}

    def declaration(space: str, written: str, key: str, param: str, axis: int) -> tuple[SpaceDecl, dict]:
        """The declaration of instance `space`, which the spec wrote as `written` (a family's name when it
        has a {capture}): that family, so that families whose instances overlap ("mlp{i}" and "mlp_gate{i}")
        keep their own groups; a name written literally must match one family only."""
        if space in decls:
            return decls[space], {}
        candidates = [(d, m.captures) for d, pattern in families if (m := pattern.fullmatch(space))]
        chosen = [c for c in candidates if c[0].name == written] or candidates
        if len(chosen) > 1:
            raise SpecError(f"space {short(space)!r} is an instance of several families: "
                            f"{few(d.name for d, _ in chosen)}", file=spec.source, key=key, param=param, axis=axis,
                            hint="write the family's own name in the rule, or rename the families so that their "
                                 "instances cannot coincide")
        if not chosen:
            raise SpecError(f"space {short(space)!r} is not declared", file=spec.source, key=key,
                            param=param, axis=axis, hint=f"declare it under [spaces] (declared: {few(decls)})")
        return chosen[0]

    def resolve(space: str, key: str, param: str, axis: int, owner_of: str | None = None,
                written: str | None = None) -> None:
        found = declaration(space, space if written is None else written, key, param, axis)
        if space in resolved and resolved[space][0] is not found[0]:
            raise SpecError(f"space {short(space)!r} is written as an instance of both {resolved[space][0].name!r} "
                            f"and {found[0].name!r}", file=spec.source, key=key, param=param, axis=axis,
                            hint="rename one of the families so that their instances cannot coincide")
        if space in resolved and owner_of is None:
            return
        resolved[space] = found
        d, caps = resolved[space]
        if d.per is not None and owner_of is not None:  # checked here, so a per chain never recurses
            raise _nested_per(space, owner_of, spec.source, key)
        if d.per is not None:
            owner = substitute(d.per, caps, spec.source, f"spaces.{d.name}.per", param, axis)
            if owner == space:
                raise SpecError(f"space {space!r} is declared per itself", file=spec.source,
                                key=f"spaces.{d.name}.per", hint="per must name a different space (the head index)")
            resolve(owner, f"spaces.{d.name}.per", param, axis, owner_of=space, written=d.per)

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
                atoms = tuple(substitute(x, caps, spec.source, key, name, a) for x in seg)
                for x, written in zip(atoms, seg):
                    if x != FREE:
                        resolve(x, key, name, a, written=written)
                out.append(atoms)
            axes.append(out)
        concrete[name] = axes
    return resolved, concrete


# The groups an owner of `per` spaces may have: identity (each index keeps its own element), or perm and
# signed_perm, which move the owner's indices as wholes with the per-spaces' elements riding along (a
# wreath product: docs/specs.md, "Permuting heads").
OWNER_GROUPS = ("identity", "perm", "signed_perm")


def _nested_per(owner: str, space: str, source: str, key: str) -> SpecError:
    """The error for a `per` chain: `owner`, which `space` is declared per, is itself declared per another."""
    return SpecError(f"owner {owner!r} of {space!r} is itself declared per another space", file=source, key=key,
                     hint="nest at most one level of per")


def _bind_spaces(spec: Spec, resolved: dict, sizes: dict[str, int]) -> dict[str, BoundSpace]:
    """The bound spaces in declaration order (family instances numerically), each with its owner
    checked and its size's name in generated code."""
    rank = {d.name: i for i, d in enumerate(spec.spaces)}
    spaces: dict[str, BoundSpace] = {}
    taken: set[str] = set()
    for s in sorted(resolved, key=lambda s: _decl_order(rank, resolved[s][0], s)):
        d, caps = resolved[s]
        per = substitute(d.per, caps, spec.source, "") if d.per else None
        if per is not None and resolved[per][0].group not in OWNER_GROUPS:
            raise SpecError(f"space {s!r} is declared per {per!r}, whose group is "
                            f"{resolved[per][0].group!r}; an owner's group must be one of {list(OWNER_GROUPS)} "
                            "(a rotation of the owner would mix the indices that pick the per-space's elements)",
                            file=spec.source, key=f"spaces.{d.name}.per",
                            hint=f"declare {per!r} with group = \"perm\" (heads permuted as wholes) or "
                                 "\"identity\" (heads kept in place)")
        if per is not None and resolved[per][0].per is not None:
            raise _nested_per(per, s, spec.source, f"spaces.{d.name}.per")
        spaces[s] = BoundSpace(name=s, group=d.group, size=sizes[s], per=per, decl=d.name,
                               symbol=space_symbol(s, taken))
    return spaces


def _decl_order(rank: dict[str, int], decl: SpaceDecl, name: str) -> tuple:
    # families: order instances numerically where the captures are numbers (h2 before h10)
    return (rank[decl.name], [int(t) if t.isdecimal() else t for t in re.split(r"(\d+)", name)])  # "²".isdigit()


def _cut_params(spec: Spec, matched: dict, concrete: dict, shapes: Mapping, sizes: dict[str, int],
                spaces: dict[str, BoundSpace]) -> tuple[BoundParam, ...]:
    """Every matched parameter cut into blocks, in the model's order, with each block's checks."""
    taken = {sp.symbol for sp in spaces.values()}
    params = []
    for pi, (name, axes) in enumerate(concrete.items()):
        key = f"params.{matched[name][0].pattern!r}"
        p = _cut_blocks(name, pi, shapes[name], axes, sizes, spaces, key, parameter_stem(name, pi), taken)
        for b in p.blocks:
            _check_block(spec, key, name, b, spaces)
        params.append(p)
    return tuple(params)


def _check_block(spec: Spec, key: str, name: str, b: Block, spaces: dict[str, BoundSpace]) -> None:
    """A space repeated in the block must be one compiler.repeated compiles; a per-space needs its
    owner in the block, to say which group element acts."""
    named = [a.space for a in b.atoms if a.space is not None]
    if len(set(named)) != len(named):
        for space in sorted({s for s in named if named.count(s) > 1}):
            _check_repeated(spec.source, key, name, spaces[space], named.count(space), spaces, named)
    for space in named:
        owner = spaces[space].per
        if owner is not None and owner not in named:
            raise SpecError(f"space {space!r} is declared per {owner!r}, but this block "
                            f"has no {owner!r} axis to say which group element acts",
                            file=spec.source, key=key, param=name,
                            hint=f"write the axis as a product, e.g. \"({owner} {space})\"")


def _infer_sizes(spec: Spec, resolved: dict, matched: dict, concrete: dict, shapes: Mapping, given: Mapping,
                 ) -> dict[str, int]:
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
        key, shape = f"params.{matched[name][0].pattern!r}", shapes[name]
        for a, segs in enumerate(axes):
            terms = tuple(tuple(f"_:{name}:{a}:{j}" if x == FREE else x for x in seg) for j, seg in enumerate(segs))
            eqs.append(AxisEquation(name, a, key, terms, shape[a]))
    return solve_sizes(eqs, sizes, spec.source, {s: d.name for s, (d, _) in resolved.items()})



def _cut_blocks(name: str, pi: int, shape: tuple[int, ...], axes: list, sizes: dict[str, int],
                spaces: dict[str, BoundSpace], key: str, stem: str, taken: set[str]) -> BoundParam:
    per_axis = []  # for each axis: list of (start, length, atoms)
    for a, segs in enumerate(axes):
        opts, start = [], 0
        for j, seg in enumerate(segs):
            atoms = tuple([Atom(None, sizes[f"_:{name}:{a}:{j}"], free_symbol(stem, a, j, len(segs), taken))
                           if x == FREE else Atom(x, sizes[x], spaces[x].symbol) for x in seg])
            length = atoms[0].size if len(atoms) == 1 else math.prod(at.size for at in atoms)
            opts.append((start, length, atoms))
            start += length
        per_axis.append(opts)
    if all(len(opts) == 1 for opts in per_axis):  # one block, the whole tensor (most parameters)
        blocks = (Block(name, 0, tuple((0, opts[0][1]) for opts in per_axis), tuple(opts[0][2] for opts in per_axis)),)
        return BoundParam(name=name, shape=tuple(shape), rule=key, blocks=blocks, fused_axes=())
    blocks = tuple(Block(param=name, index=i, slices=tuple((s, n) for s, n, _ in choice),
                         axes=tuple(atoms for _, _, atoms in choice))
                   for i, choice in enumerate(itertools.product(*per_axis)))
    fused = tuple(a for a, opts in enumerate(per_axis) if len(opts) > 1)
    return BoundParam(name=name, shape=tuple(shape), rule=key, blocks=blocks, fused_axes=fused)


def _check_repeated(source: str, key: str, param: str, space: BoundSpace, count: int,
                   spaces: Mapping[str, BoundSpace], block_spaces: list[str]) -> None:
    """Raise SpecError for a space repeated in one block that compiler.repeated does not compile."""
    where = dict(file=source, key=key, param=param)
    if count > 2:
        raise SpecError(f"space {space.name!r} occurs {count} times in one block of the parameter; "
                        "a space may repeat at most twice in one block of a parameter",
                        **where, hint="give the third occurrence its own space (a relaxed group)")
    owned = [s for s in block_spaces if spaces[s].per == space.name]
    if owned:
        raise SpecError(f"space {space.name!r} occurs twice in one block and owns the per-space "
                        f"{owned[0]!r}: which of its indices picks the group element is ambiguous",
                        **where, hint="use a different owner space for one of the two axes")
    if space.group == "identity":
        return
    if space.per is not None:
        raise SpecError(f"space {space.name!r} is declared per {space.per!r} and occurs twice in one "
                        "block; repeated per-spaces are not compiled", **where,
                        hint="declare the repeated space without per, or use two spaces")
    least = 3 if space.group == "perm" else 2
    if space.size < least:
        raise SpecError(f"space {space.name!r} ({space.group}) occurs twice in one block but has size "
                        f"{space.size}; a repeated {space.group} space needs size >= {least}", **where,
                        hint="use a larger width, or the identity group for so small a space")
