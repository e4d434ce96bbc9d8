"""Compile once per template: families of identical layers share one derivation and one loop.

A *unit* is a set of parameters joined by the spaces they share (one attention layer, one MLP).
Two units are *members of one family* when they are equal up to names: the same number of
parameters, each cut into the same blocks of atoms, their spaces of the same groups (and `per`
owners, and perm spaces of size 1, which have no standard piece) in the same positions and the same
declaration order. A `{i}` stack of layers is the typical family; equality is checked on the bound
layout, so layers written out one by one form a family too.

For each family the structure is derived once, on a representative whose sizes are renamed to
names without the layer (`rep`: n_mlp for n_mlp3, d_c_fc_weight_dim1 for
d_h_3_mlp_c_fc_weight_dim1; compiler.size_names). The generated module carries the members as data,
a table of parameter names, space names, block ids and size names (repr literals: input text never
becomes code), and loops over it in gather, scatter and BLOCKS. So the sympy work and the generated code do not
grow with depth; only the table does. Blocks inside a member keep the ids the per-layer
derivation gives them (L<i>, numbered over the whole spec); the trivial block, which couples every
member, takes its rows as a running offset computed in the loop, never as a sum over members. Its
rows are ordered parameters outside families first, then each family member by member (a
permutation of the per-layer order when several families or outside parameters have trivial rows,
which changes no result: S on the block is conjugated by the permutation).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from .bound import Atom, Block, BoundParam, BoundSpec, connected
from .size_names import family_space_symbol, free_symbol, parameter_stems
from .structure import label_groups

TEMPLATES_VERSION = "1"
MIN_MEMBERS = 2  # a family of one gains nothing from a loop


@dataclass(frozen=True)
class Family:
    """Units equal up to names. Row k of `params`, `spaces`, `symbols` is member k's parameter names
    (in the unit's order), space names (in order of first appearance) and size names; `local` are
    the representative's size names in the same order (the loop's variables)."""

    rep: BoundSpec
    params: tuple[tuple[str, ...], ...]
    spaces: tuple[tuple[str, ...], ...]
    symbols: tuple[tuple[str, ...], ...]
    local: tuple[str, ...]


@dataclass(frozen=True)
class TemplatePlan:
    """The families of a bound spec and the parameters outside them (`rest`)."""

    families: tuple[Family, ...]
    rest: BoundSpec
    bound: BoundSpec

    @functools.cached_property
    def ids(self) -> dict[tuple, str]:
        """(label, batch spaces) -> block id as the per-layer derivation numbers them (L0, L1, ...).
        Computed only when code is generated: a cache hit needs just the plan's key."""
        return {key: f"L{i}" for i, key in enumerate(label_groups(self.bound))}

    def member_ids(self, family: Family, member: int, label: tuple, batch_spaces: tuple) -> str:
        """The id, in the whole spec, of a representative block's counterpart in `member`."""
        local = {s: k for k, s in enumerate(family.spaces[0])}
        names = family.spaces[member]
        return self.ids[(tuple((names[local[s]], piece) for s, piece in label),
                         tuple(names[local[s]] for s in batch_spaces))]


def find_families(bound: BoundSpec, min_members: int = MIN_MEMBERS) -> TemplatePlan | None:
    """Group the parameters into units and the units into families; None when no family has
    `min_members` members (the spec then compiles layer by layer)."""
    rank = {s: i for i, s in enumerate(bound.spaces)}
    by_signature: dict[tuple, list] = {}
    for params in _units(bound):
        signature, spaces, symbols = _signature(params, bound, rank)
        by_signature.setdefault(signature, []).append((params, spaces, symbols))
    found = [members for members in by_signature.values() if len(members) >= min_members]
    if not found:
        return None
    in_family = {p.name for members in found for m in members for p in m[0]}
    rest_params = tuple(p for p in bound.params if p.name not in in_family)
    used = {a.space for p in rest_params for b in p.blocks for a in b.atoms if a.space is not None}
    rest = dataclasses.replace(bound, params=rest_params,
                               spaces={s: sp for s, sp in bound.spaces.items() if s in used})
    families = []
    for members in found:
        rep, local = _representative(bound, members[0], set(rest.sizes))
        families.append(Family(rep=rep, params=tuple(tuple(p.name for p in m[0]) for m in members),
                               spaces=tuple(m[1] for m in members), symbols=tuple(m[2] for m in members),
                               local=local))
    return TemplatePlan(families=tuple(families), rest=rest, bound=bound)


def _units(bound: BoundSpec) -> list[list[BoundParam]]:
    """Parameters joined by shared spaces, each unit in model order, units by first parameter."""
    by_name = {p.name: p for p in bound.params}
    links = [(p.name, [("space", a.space) for b in p.blocks for a in b.atoms if a.space is not None])
             for p in bound.params]
    return [[by_name[n] for n in comp if n in by_name] for comp in connected(links)]


def _signature(params: list[BoundParam], bound: BoundSpec, rank: dict[str, int]) -> tuple:
    """What the generated code of a unit depends on, with names replaced by positions; and the unit's
    spaces and size symbols in order of first appearance."""
    spaces: dict[str, int] = {}
    symbols: dict[str, int] = {}
    layout = []
    for p in params:
        blocks = []
        for b in p.blocks:
            axes = []
            for axis in b.axes:
                atoms = []
                for a in axis:
                    k = symbols.setdefault(a.symbol, len(symbols))
                    if a.space is None:
                        atoms.append((k,))
                    else:
                        sp = bound.spaces[a.space]
                        atoms.append((k, spaces.setdefault(a.space, len(spaces)), sp.group,
                                      sp.group == "perm" and a.size == 1))
                axes.append(tuple(atoms))
            blocks.append(tuple(axes))
        layout.append((len(p.shape), p.fused_axes, tuple(blocks)))
    names = tuple(spaces)
    owners = tuple(spaces.get(bound.spaces[s].per, -1) if bound.spaces[s].per else None for s in names)
    order = tuple(sorted(range(len(names)), key=lambda k: rank[names[k]]))
    return (tuple(layout), owners, order), names, tuple(symbols)


def _representative(bound: BoundSpec, member: tuple, taken: set[str]) -> tuple[BoundSpec, tuple[str, ...]]:
    """The first member as a spec of its own, its sizes renamed to names without the layer (n_mlp,
    d_c_fc_weight_dim1), none of them in `taken` (the names outside families, which the loops must
    not shadow); and those names in the order of the member's size symbols."""
    params, spaces, symbols = member
    local: dict[str, str] = {}
    for sp in (bound.spaces[s] for s in spaces):
        local[sp.symbol] = family_space_symbol(sp.decl, taken)
    for p, stem in zip(params, parameter_stems([p.name for p in params])):
        starts = [sorted({b.slices[a][0] for b in p.blocks}) for a in range(len(p.shape))]
        for b in p.blocks:
            for a, axis in enumerate(b.axes):
                for atom in axis:
                    if atom.space is None and atom.symbol not in local:
                        local[atom.symbol] = free_symbol(stem, a, starts[a].index(b.slices[a][0]), len(starts[a]),
                                                         taken)
    rep_params = []
    for p in params:
        blocks = tuple(Block(param=b.param, index=b.index, slices=b.slices,
                             axes=tuple(tuple(Atom(a.space, a.size, local[a.symbol]) for a in axis)
                                        for axis in b.axes))
                       for b in p.blocks)
        rep_params.append(dataclasses.replace(p, blocks=blocks))
    used = set(spaces)
    rep_spaces = {s: dataclasses.replace(sp, symbol=local[sp.symbol]) for s, sp in bound.spaces.items() if s in used}
    rep = dataclasses.replace(bound, params=tuple(rep_params), spaces=rep_spaces, uncovered=())
    return rep, tuple(local[x] for x in symbols)
