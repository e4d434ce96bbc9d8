"""From a trace to an explicit layout: which spaces exist, their groups, and each parameter's axes.

A *layout* is the spec before naming and {i} patterns: `Space` objects keyed by an integer id, and for
every covered parameter a list of axes, each a list of fused segments, each a tuple of space ids or the
free marker `("_", length)`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from .axes import GROUP_OF_RANK
from .trace import TraceResult

FREE = "_"


def is_free(x) -> bool:
    """A segment item is a space id (int) or a free factor ("_", length)."""
    return isinstance(x, tuple)


@dataclass
class Space:
    id: int
    size: int
    group: str
    why: str  # what decided the group
    roles: set[str] = field(default_factory=set)
    per: int | None = None
    params: list[str] = field(default_factory=list)
    synthetic: bool = False  # an identity factor standing for a fixed axis inside a product
    pinned: str | None = None  # a head axis that meets a fixed tensor: why its heads stay in their slots


@dataclass
class Dropped:
    """A would-be space that is not declared, and why."""

    reason: str
    params: list[str]


@dataclass
class Layout:
    spaces: dict[int, Space]
    axes: dict[str, list[list[tuple]]]  # param -> axes -> segments -> (space ids | ("_", n))
    shapes: dict[str, tuple[int, ...]]
    dropped: list[Dropped]
    unknown: list[tuple[str, list[str]]]
    notes: list[str]
    out_axis: dict[str, int]

    def drop(self, sid: int, reason: str) -> None:
        """Remove a space: its axes become free and the parameters it leaves without a space uncovered."""
        space = self.spaces.pop(sid, None)
        if space is None:
            return
        self.dropped.append(Dropped(reason, list(space.params)))
        for name, axes in self.axes.items():
            self.axes[name] = [_free_segments([tuple(("_", space.size) if x == sid else x for x in seg)
                                               for seg in axis], self) for axis in axes]
        for other in self.spaces.values():
            if other.per == sid:
                other.per = None
        self.prune()

    def new_id(self) -> int:
        self._next = getattr(self, "_next", -1) - 1
        return self._next

    def prune(self) -> None:
        """Parameters whose every axis is free are uncovered."""
        for name in [n for n, axes in self.axes.items()
                     if all(all(is_free(x) for x in seg) for axis in axes for seg in axis)]:
            del self.axes[name]
        used = {x for axes in self.axes.values() for axis in axes for seg in axis for x in seg if not is_free(x)}
        for sid in [s for s in self.spaces if s not in used]:
            self.spaces.pop(sid)
        for s in self.spaces.values():
            s.params = [n for n in self.axes if any(sid == s.id for axis in self.axes[n] for seg in axis
                                                    for sid in seg)]

    @property
    def covered(self) -> list[str]:
        return list(self.axes)


def _free_segments(segments: list[tuple], layout: Layout) -> list[tuple]:
    """Products of free factors become one free factor; adjacent free segments merge."""
    out = []
    for seg in segments:
        if all(is_free(x) for x in seg):
            seg = (("_", math.prod(x[1] for x in seg)),)
        elif any(is_free(x) for x in seg):  # a fixed factor inside a product: an identity space
            seg = tuple(_synthetic(layout, x[1]) if is_free(x) else x for x in seg)
        if out and is_free(seg[0]) and len(seg) == 1 and len(out[-1]) == 1 and is_free(out[-1][0]):
            out[-1] = (("_", out[-1][0][1] + seg[0][1]),)
        else:
            out.append(seg)
    frees = [i for i, seg in enumerate(out) if len(seg) == 1 and is_free(seg[0])]
    for i in frees[1:]:  # the grammar allows one free segment of unknown length per fused axis
        out[i] = (_synthetic(layout, out[i][0][1]),)
    return out


def _synthetic(layout: Layout, size: int):
    sid = layout.new_id()
    layout.spaces[sid] = Space(sid, size, "identity", "a fixed axis inside a product", synthetic=True)
    return sid


def build_layout(tr: TraceResult, shapes: dict[str, tuple[int, ...]], heads: int | None = None) -> Layout:
    g = tr.graph
    pinned, caps = g.effective()
    roles: dict[int, set[str]] = {}
    for a, rs in g.roles.items():
        roles.setdefault(g.find(a), set()).update(rs)
    layout = Layout({}, {}, dict(shapes), [], [], list(tr.notes), dict(tr.out_axis))
    breaking: dict[int, list[str]] = {}
    unused = [n for n in tr.param_atoms if n not in tr.used]
    if unused:
        layout.notes.append(f"not used by the forward pass on these inputs (left uncovered): {', '.join(unused)}")
    for name, atoms in tr.param_atoms.items():
        if name not in tr.used:
            continue
        axes = []
        for a, n in zip(atoms, shapes[name]):
            segs = g.segments(a)
            if segs is None:  # a concatenation inside a product: report what pinned its parts, if anything did
                reasons = [r for leaf in _all_leaves(g, a) for r in pinned.get(g.find(leaf), [])]
                if not reasons:
                    layout.dropped.append(Dropped("a concatenation inside a product (not expressible)", [name]))
                for leaf in _all_leaves(g, a):
                    if pinned.get(g.find(leaf)):
                        breaking.setdefault(g.find(leaf), pinned[g.find(leaf)])
                axes.append([(("_", n),)])
                continue
            axis = []
            for seg in segs:
                items = []
                for leaf in seg:
                    r = g.find(leaf)
                    if r in pinned and len(seg) > 1 and "head" in roles.get(r, ()):
                        # heads tied to their slots (ALiBi slopes, a per-head fixed mask): the head axis stays,
                        # as an identity owner of its per-head groups, rather than a fixed factor
                        items.append(r)
                        if r not in layout.spaces:
                            why = "; ".join(pinned[r]) or "the head axis meets the inputs"
                            layout.spaces[r] = Space(r, g.size[r], "identity", why, roles.get(r, set()), pinned=why)
                        continue
                    if r in pinned:
                        if pinned[r]:
                            breaking.setdefault(r, pinned[r])
                        items.append(("_", g.size[r]))
                    else:
                        items.append(r)
                        if r not in layout.spaces:
                            rank, why = caps.get(r, (3, "only linear operations act on it"))
                            layout.spaces[r] = Space(r, g.size[r], GROUP_OF_RANK[rank], why, roles.get(r, set()))
                axis.append(tuple(items))
            axes.append(axis)
        layout.axes[name] = [_free_segments(axis, layout) for axis in axes]
    # report would-be spaces that a breaking operation pinned, with the parameters they touch
    touched: dict[tuple[str, ...], set[str]] = {}
    for name, atoms in tr.param_atoms.items():
        for a in atoms:
            for leaf in _all_leaves(g, a):
                if leaf in breaking:
                    touched.setdefault(tuple(breaking[leaf]), set()).add(name)
    for reasons, params in touched.items():
        reasons = [r for r in reasons if not r.startswith("unsupported operation")]  # reported on their own
        if reasons:
            layout.dropped.append(Dropped("; ".join(reasons), sorted(params, key=list(shapes).index)))
    for op, atoms in tr.unknown:
        roots = {g.find(x) for a in atoms for x in _all_leaves(g, a)}
        params = [n for n, pa in tr.param_atoms.items()
                  if any(g.find(x) in roots for a in pa for x in _all_leaves(g, a))]
        layout.unknown.append((op, params))
    layout.prune()
    _repeated_spaces(layout)
    _owners(layout, heads)
    layout.prune()
    return layout


def _all_leaves(g, a) -> list[int]:
    r = g.find(a)
    d = g.defn.get(r)
    if d is None:
        return [r]
    return [r] + [x for p in d[1] for x in _all_leaves(g, p)]


def _blocks(axes):
    return itertools.product(*axes)


def _repeated_spaces(layout: Layout) -> None:
    changed = True
    while changed:
        changed = False
        for name, axes in list(layout.axes.items()):
            for block in _blocks(axes):
                ids = [x for seg in block for x in seg if not is_free(x)]
                seen = {x for x in ids if ids.count(x) > 1}
                for sid in seen:
                    if sid in layout.spaces:
                        layout.drop(sid, f"occurs twice in one block of {name} (a repeated space: inference "
                                    "does not propose those; write it by hand, docs/repeated_spaces.md)")
                        changed = True
                if changed:
                    break
            if changed:
                break


def _owners(layout: Layout, heads: int | None) -> None:
    """Per-head groups: in a product (head d), d gets one group element per head when every block
    holding d also holds the head axis. The head axis becomes their owner: `perm` (heads permuted as wholes,
    each carrying its own per-head elements: docs/specs.md, Example 4), or `identity` where a fixed tensor
    varies along the heads (ALiBi slopes, a per-head mask) and ties each head to its slot. A pinned head
    axis that owns nothing is left free, with its reason reported."""
    candidates: dict[int, set[int]] = {}
    for axes in layout.axes.values():
        for axis in axes:
            for seg in axis:
                for i, x in enumerate(seg[1:], start=1):
                    h = seg[i - 1]
                    if not is_free(x) and not is_free(h) and "head" in layout.spaces[h].roles:
                        candidates.setdefault(x, set()).add(h)
    for d, hs in candidates.items():
        if len(hs) != 1:
            continue
        (h,) = hs
        ok = all(h in [y for seg in block for y in seg]
                 for axes in layout.axes.values() for block in _blocks(axes)
                 if d in [y for seg in block for y in seg])
        if ok and d in layout.spaces and h in layout.spaces:
            layout.spaces[d].per = h
            owner = layout.spaces[h]
            if owner.pinned is not None:
                owner.group, owner.why = "identity", f"owner of per-head groups; heads stay in place: {owner.pinned}"
            else:
                owner.group, owner.why = "perm", "owner of per-head groups: heads permuted as wholes"
    owners = {s.per for s in layout.spaces.values() if s.per is not None}
    for sid in [s.id for s in layout.spaces.values() if s.pinned is not None and s.id not in owners]:
        layout.drop(sid, layout.spaces[sid].pinned)
    if heads:  # attention axes that the graph did not split into heads: split them now
        for sid, space in list(layout.spaces.items()):
            if space.per is not None or not ({"qk", "vo"} & space.roles) or space.size % heads:
                continue
            if any(sid in seg and len(seg) > 1 for axes in layout.axes.values() for axis in axes for seg in axis):
                continue
            h = layout.new_id()
            layout.spaces[h] = Space(h, heads, "identity", f"heads={heads} given", {"head"})
            new = Space(layout.new_id(), space.size // heads, space.group, space.why, set(space.roles), per=h)
            layout.spaces[new.id] = new
            del layout.spaces[sid]
            for name, axes in layout.axes.items():
                layout.axes[name] = [[(h, new.id) if seg == (sid,) else seg for seg in axis] for axis in axes]
