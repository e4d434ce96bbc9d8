"""The axis algebra behind `symo.infer_spec`: which tensor axes carry the same hidden units.

Every axis of every traced tensor is an *atom* of a union-find structure. Operations unify atoms (a
Linear's rows with its output's features, the two sides of a residual addition), refine an atom into
a product (a view into heads: C -> (head, d_head)) or a concatenation (c_attn's output split into
q | k | v), *pin* atoms that no group may move (inputs, outputs, kernel offsets, an axis that meets a
fixed tensor), and *cap* the group an atom may carry (ReLU caps it at perm). At the end every
parameter axis resolves to the spec grammar: fused segments of products of leaf atoms.
"""

from __future__ import annotations

RANK = {"perm": 1, "signed_perm": 2, "orthogonal": 3}
GROUP_OF_RANK = {v: k for k, v in RANK.items()}


class AxisGraph:
    """Union-find over axis atoms, with refinements (products, concatenations), pins and group caps."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.defn: dict[int, tuple[str, list[int]]] = {}  # root -> ("prod" | "fused", parts)
        self.pinned: dict[int, list[str]] = {}  # root -> reasons that broke a would-be space (may be empty)
        self.caps: list[tuple[int, int, str]] = []  # (atom, max group rank, reason)
        self.roles: dict[int, set[str]] = {}  # atom -> {"qk", "vo", "head", "res"} (for names only)

    # ------------------------------------------------------------ basics
    def new(self, size: int, pinned: bool = False) -> int:
        a = len(self.parent)
        self.parent.append(a)
        self.size.append(int(size))
        if pinned or size == 1:
            self.pinned[a] = []
        return a

    def find(self, a: int) -> int:
        root = a
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[a] != root:
            self.parent[a], a = root, self.parent[a]
        return root

    def is_pinned(self, a: int) -> bool:
        return self.find(a) in self.pinned

    def pin(self, a: int, reason: str | None = None) -> None:
        reasons = self.pinned.setdefault(self.find(a), [])
        if reason and reason not in reasons:
            reasons.append(reason)

    def cap(self, a: int, group: str, reason: str) -> None:
        self.caps.append((a, RANK[group], reason))

    def role(self, a: int, role: str) -> None:
        self.roles.setdefault(a, set()).add(role)

    def unify(self, a: int, b: int, breaking: str | None = None) -> None:
        """Make two atoms one. `breaking` is recorded when a free atom meets a pinned one here (an axis
        that meets a fixed tensor): it is why a would-be space is dropped."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] != self.size[rb]:  # a malformed op: keep both fixed rather than guess
            self.pin(ra, "axes of different sizes meet")
            self.pin(rb, "axes of different sizes meet")
            return
        pa, pb = ra in self.pinned, rb in self.pinned
        self.parent[rb] = ra
        if pa or pb:
            reasons = self.pinned.pop(ra, []) + self.pinned.pop(rb, [])
            if pa != pb and breaking:
                reasons.append(breaking)
            self.pinned[ra] = list(dict.fromkeys(reasons))
        da, db = self.defn.pop(ra, None), self.defn.pop(rb, None)
        if da is None or db is None:
            if da or db:
                self.defn[ra] = da or db
            return
        self.defn[ra] = da
        if da[0] == db[0] and [self.size[x] for x in da[1]] == [self.size[x] for x in db[1]]:
            for x, y in zip(da[1], db[1]):
                self.unify(x, y, breaking)
        else:
            self.pin(ra, "one axis is split in two incompatible ways")

    # ------------------------------------------------------------ refinements
    def leaves(self, a: int) -> list[int]:
        """The factors of an atom, products expanded, size-1 factors dropped."""
        r = self.find(a)
        d = self.defn.get(r)
        if d is not None and d[0] == "prod":
            return [leaf for p in d[1] for leaf in self.leaves(p)]
        return [r] if self.size[r] > 1 else []

    def product(self, parts: list[int]) -> int:
        parts = [p for p in parts if self.size[self.find(p)] > 1]
        if len(parts) == 1:
            return parts[0]
        size = 1
        for p in parts:
            size *= self.size[self.find(p)]
        a = self.new(size)
        if parts:
            self.pinned.pop(a, None)
            self.defn[a] = ("prod", parts)
        return a

    def fused(self, parts: list[int]) -> int:
        if len(parts) == 1:
            return parts[0]
        a = self.new(sum(self.size[self.find(p)] for p in parts))
        self.pinned.pop(a, None)
        self.defn[a] = ("fused", list(parts))
        return a

    def split_factor(self, leaf: int, first: int) -> tuple[int, int] | None:
        """Refine a leaf of size n into the product (first, n / first)."""
        r = self.find(leaf)
        if r in self.defn or self.size[r] % first:
            return None
        x, y = self.new(first), self.new(self.size[r] // first)
        self.defn[r] = ("prod", [x, y])
        return x, y

    def split_fused(self, a: int, sizes: list[int]) -> list[int] | None:
        """The pieces of a concatenated axis (split / chunk): reuse a matching refinement or make one."""
        if len(sizes) == 1:
            return [a]
        r = self.find(a)
        d = self.defn.get(r)
        if d is None:
            parts = [self.new(s) for s in sizes]
            self.defn[r] = ("fused", parts)
            return parts
        if d[0] == "fused" and [self.size[self.find(p)] for p in d[1]] == list(sizes):
            return list(d[1])
        return None

    def reshape(self, atoms: list[int], out_shape: list[int]) -> list[int] | None:
        """Atoms of a view/reshape's output; None where the grouping is not understood."""
        leaves = [leaf for a in atoms for leaf in self.leaves(a)]
        out, i = [], 0
        for s in out_shape:
            if s == 1:
                out.append(self.new(1))
                continue
            group, prod = [], 1
            while prod < s:
                if i >= len(leaves) or s % prod:
                    return None
                leaf, need = leaves[i], s // prod
                n = self.size[self.find(leaf)]
                if need % n == 0:
                    group.append(leaf)
                    prod *= n
                    i += 1
                elif n % need == 0:
                    pieces = self.split_factor(leaf, need)
                    if pieces is None:
                        return None
                    group.append(pieces[0])
                    leaves[i] = pieces[1]
                    prod *= need
                else:
                    return None
            out.append(group[0] if len(group) == 1 else self.product(group))
        return out if i == len(leaves) else None

    # ------------------------------------------------------------ resolution
    def segments(self, a: int) -> list[list[int]] | None:
        """An axis in the spec grammar: fused segments, each a product of leaf roots (None: a
        concatenation inside a product, which the grammar cannot write)."""
        r = self.find(a)
        d = self.defn.get(r)
        if d is None:
            return [[r]]
        if d[0] == "fused":
            out = []
            for p in d[1]:
                segs = self.segments(p)
                if segs is None:
                    return None
                out.extend(segs)
            return out
        factors = []
        for p in d[1]:
            segs = self.segments(p)
            if segs is None or len(segs) > 1:
                return None
            factors.extend(x for x in segs[0] if self.size[x] > 1)
        return [factors or [r]]

    def effective(self) -> tuple[dict[int, list[str]], dict[int, tuple[int, str]]]:
        """Pins and caps of every root, with a container's pins and caps passed down to its parts."""
        pinned = {self.find(r): list(v) for r, v in self.pinned.items()}
        caps: dict[int, tuple[int, str]] = {}
        for a, rank, reason in self.caps:
            r = self.find(a)
            if r not in caps or rank < caps[r][0]:
                caps[r] = (rank, reason)
        changed = True
        while changed:
            changed = False
            for r, (_, parts) in list(self.defn.items()):
                r = self.find(r)
                for p in parts:
                    p = self.find(p)
                    if r in pinned and p not in pinned:
                        pinned[p] = list(pinned[r])
                        changed = True
                    if r in caps and (p not in caps or caps[r][0] < caps[p][0]):
                        caps[p] = caps[r]
                        changed = True
        return pinned, caps
