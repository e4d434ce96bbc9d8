"""The data type between stage 2 (validate) and the later stages: `BoundSpec`, a spec bound to concrete
parameter shapes, with its spaces, parameters, blocks and atoms. No TOML and no logic beyond what reads
the bound spec; `validate.bind` builds it, `structure`, `templates` and `tier2` read it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import networkx as nx


@dataclass(frozen=True)
class BoundSpace:
    """A concrete space with its size; `per` names the owner space for a family of groups."""

    name: str
    group: str
    size: int
    per: str | None
    decl: str  # the [spaces] key it came from, for messages
    symbol: str  # its size's name in generated code, e.g. n_h1


@dataclass(frozen=True)
class Atom:
    """One axis of a block: a space, or a free axis (space None). `symbol` names its size in the
    generated code (n_<space>, or f<param>_<axis>_<segment> for a free axis)."""

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

    @property
    def atoms(self) -> tuple[Atom, ...]:
        return tuple(a for axis in self.axes for a in axis)


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
    graph: nx.MultiGraph  # nodes ("space", s) and ("block", param, i); one edge per occurrence

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
        """Which blocks the group couples: connected components of the incidence graph (blocks and
        the spaces a non-trivial group acts on), as (spaces, parameters) pairs. A parameter cut into
        blocks (c_attn's q/k and v rows) can sit in several. Different components never share a
        label, except through trivial pieces of perm spaces (the structure stage adds those)."""
        moving = [n for n in self.graph if n[0] == "block" or self.spaces[n[1]].group != "identity"]
        order = {p.name: i for i, p in enumerate(self.params)}  # positions: list.index is quadratic in depth
        out = []
        for comp in nx.connected_components(self.graph.subgraph(moving)):
            spaces = sorted(n[1] for n in comp if n[0] == "space")
            params = sorted({n[1] for n in comp if n[0] == "block"}, key=order.__getitem__)
            if params:
                out.append((spaces, params))
        return sorted(out, key=lambda sp: order[sp[1][0]])

    @property
    def sizes(self) -> dict[str, int]:
        """symbol -> size for every symbol the generated code reads."""
        out = {s.symbol: s.size for s in self.spaces.values()}
        for p in self.params:
            for b in p.blocks:
                out.update((a.symbol, a.size) for a in b.atoms)
        return out
