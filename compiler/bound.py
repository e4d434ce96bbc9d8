"""The data type between stage 2 (bind) and the later stages: `BoundSpec`, a spec bound to concrete
parameter shapes, with its spaces, parameters, blocks and atoms. No TOML and no logic beyond what reads
the bound spec; `bind.bind` builds it, `structure`, `templates` and `repeated` read it."""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class BoundSpace:
    """A concrete space with its size; `per` names the owner space for a family of groups."""

    name: str
    group: str
    size: int
    per: str | None
    decl: str  # the [spaces] key it came from, for messages
    symbol: str  # its size's name in generated code, e.g. n_h1


class Atom(NamedTuple):
    """One axis of a block: a space, or a free axis (space None). `symbol` names its size in the
    generated code (compiler.size_names: n_<space>, or d_<parameter>_dim<axis> for a free axis)."""

    space: str | None
    size: int
    symbol: str


@dataclass(frozen=True)
class Block:
    """A sub-tensor of a parameter: `slices[a]` = (start, length) on parameter axis a; `axes[a]` the
    atoms that axis splits into (row-major)."""

    param: str
    index: int
    slices: tuple[tuple[int, int], ...]
    axes: tuple[tuple[Atom, ...], ...]
    atoms: tuple[Atom, ...] = field(init=False, repr=False, compare=False)  # the axes' atoms, in order

    def __post_init__(self) -> None:
        object.__setattr__(self, "atoms", tuple(a for axis in self.axes for a in axis))


@dataclass(frozen=True)
class BoundParam:
    name: str
    shape: tuple[int, ...]
    rule: str
    blocks: tuple[Block, ...]
    fused_axes: tuple[int, ...]  # axes split into several segments


@dataclass(frozen=True)
class BoundSpec:
    """A spec bound to concrete parameter shapes: everything later stages need, no TOML left."""

    name: str
    source: str
    spaces: Mapping[str, BoundSpace]  # in declaration order, families expanded
    params: tuple[BoundParam, ...]  # covered parameters, in the model's order
    uncovered: tuple[tuple[str, tuple[int, ...]], ...]

    def layout_material(self) -> str:
        """Everything the generated code depends on, and no size: one kernel serves every width.
        (A perm space of size 1 has no standard piece, so it is part of the layout.)"""
        spaces = ";".join(f"{s.name}:{s.group}:{s.per}:{s.symbol}{':S1' if s.group == 'perm' and s.size == 1 else ''}"
                          for s in self.spaces.values())
        params = ";".join(f"{p.name}{[[(a.space, a.symbol) for a in b.atoms] for b in p.blocks]}"
                          f"{[[len(axis) for axis in b.axes] for b in p.blocks]}{p.fused_axes}"
                          for p in self.params)
        return f"{spaces}|{params}"

    def couplings(self) -> list[tuple[list[str], list[str]]]:
        """Which blocks the group couples: connected components of the incidence of blocks and the
        spaces a non-trivial group acts on, as (spaces, parameters) pairs. A parameter cut into
        blocks (c_attn's q/k and v rows) can sit in several. Different components never share a
        label, except through trivial pieces of perm spaces (the structure stage adds those)."""
        order = {p.name: i for i, p in enumerate(self.params)}  # positions: list.index is quadratic in depth
        links = [(("block", p.name, b.index), [("space", a.space) for a in b.atoms
                                               if a.space is not None and self.spaces[a.space].group != "identity"])
                 for p in self.params for b in p.blocks]
        out = []
        for comp in connected(links):
            spaces = sorted(n[1] for n in comp if n[0] == "space")
            params = sorted({n[1] for n in comp if n[0] == "block"}, key=order.__getitem__)
            if params:
                out.append((spaces, params))
        return sorted(out, key=lambda sp: order[sp[1][0]])

    @functools.cached_property
    def repeated_spaces(self) -> dict[str, int]:
        """space -> its largest number of occurrences in one block, for spaces a group moves that
        repeat (compiler.repeated compiles those layouts)."""
        out: dict[str, int] = {}
        for p in self.params:
            for b in p.blocks:
                named = [a.space for a in b.atoms if a.space is not None]
                if len(set(named)) == len(named):
                    continue
                for s in set(named):
                    if named.count(s) > 1 and self.spaces[s].group != "identity":
                        out[s] = max(out.get(s, 0), named.count(s))
        return out

    @property
    def sizes(self) -> dict[str, int]:
        """symbol -> size for every symbol the generated code reads."""
        out = {s.symbol: s.size for s in self.spaces.values()}
        for p in self.params:
            for b in p.blocks:
                out.update((a.symbol, a.size) for a in b.atoms)
        return out


def connected(links: Iterable[tuple[Hashable, Iterable[Hashable]]]) -> list[list[Hashable]]:
    """Connected components of the graph in which each node is joined to the nodes listed with it
    (union-find), each in order of first appearance, components by their first node."""
    parent: dict[Hashable, Hashable] = {}

    def find(x: Hashable) -> Hashable:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for node, others in links:
        parent.setdefault(node, node)
        for other in others:
            parent.setdefault(other, other)
            a, b = find(node), find(other)
            if a != b:
                parent[a] = b
    groups: dict[Hashable, list[Hashable]] = {}
    for node in parent:
        groups.setdefault(find(node), []).append(node)
    return list(groups.values())
