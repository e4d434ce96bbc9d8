"""Sizes as one system: every matched axis gives an equation, solved jointly for positive integers.

An axis split into fused segments, each a product of atoms, gives

    sum over segments of (product of the atoms' sizes) = the axis length.

The unknowns are the sizes of spaces (shared by every axis that names them) and of free segments
(private to their axis). Sizes given by `size =` or `sizes=` are substituted first. Then:

1. propagation: an equation with one unknown that enters it linearly (in any number of segments,
   as in c_attn's `[(head dqk), (head dqk), (head dvo)]`) fixes it at once, and the loop repeats;
2. what is left is solved jointly with sympy, one connected set of unknowns at a time (each
   equation is a polynomial with positive-integer unknowns);
3. every equation is checked with the final sizes.

Errors: *underdetermined* (the shapes leave some sizes free) names the free sizes, the axes that
mention them and which size to give; *inconsistent* names the two axes that disagree.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import NamedTuple

import sympy

from .errors import SpecError, few


class AxisEquation(NamedTuple):
    """sum_t prod(size[x] for x in terms[t]) == length, for axis `axis` of parameter `param`."""

    param: str
    axis: int
    key: str  # the TOML key of the parameter's rule
    terms: tuple[tuple[str, ...], ...]  # unknown names: a space, or "_:param:axis:segment"
    length: int

    def where(self) -> str:
        return f"axis {self.axis} of {self.param!r} (length {self.length})"


def display(x: str) -> str:
    """A size's name for messages: the space, or `_` for a free segment."""
    return "_" if x.startswith("_:") else x


def solve_sizes(equations: list[AxisEquation], known: Mapping[str, int], source: str,
                decl_of: Mapping[str, str] | None = None) -> dict[str, int]:
    """Solve the system; `known` holds the sizes given by `size =` / `sizes=` (instance names).
    `decl_of` maps an instance space (head3) to its [spaces] key (head{i}) for the hint."""
    sizes = dict(known)
    origin: dict[str, AxisEquation | None] = dict.fromkeys(known)  # which axis fixed each size
    while True:
        _propagate(equations, sizes, origin, source)
        open_eqs = [eq for eq in equations if any(x not in sizes for t in eq.terms for x in t)]
        if not open_eqs:
            break
        try:
            _solve_jointly(open_eqs, sizes, origin, source, decl_of or {})
        except SpecError as exc:
            # a free component is reported only if the rest of the system is consistent: an axis that
            # contradicts elsewhere is the more useful error (and the system has no solution at all)
            if "cannot infer" in str(exc):
                elsewhere = _inconsistency_elsewhere(equations, open_eqs, sizes, source, decl_of)
                if elsewhere is not None:
                    raise elsewhere from None
            raise
    for eq in equations:
        total = sum(math.prod(sizes[x] for x in t) for t in eq.terms)
        if total != eq.length:
            desc = " + ".join("*".join(f"{display(x)}={sizes[x]}" for x in t) for t in eq.terms)
            raise SpecError(f"inconsistent sizes: {desc} gives {total}, but the axis has length {eq.length}"
                            + _origins(eq, sizes, origin),
                            file=source, key=eq.key, param=eq.param, axis=eq.axis,
                            hint="a space shared by several axes must have the same size everywhere; "
                            "check the declared sizes and the segment split")
    return sizes


def _propagate(equations: list[AxisEquation], sizes: dict[str, int], origin: dict, source: str) -> None:
    """Fix every unknown that is alone and linear in some equation, until nothing changes. A
    worklist: an equation is looked at when it has one unknown left."""
    unknowns = {id(eq): {x for t in eq.terms for x in t if x not in sizes} for eq in equations}
    using: dict[str, list[AxisEquation]] = {}
    for eq in equations:
        for x in unknowns[id(eq)]:
            using.setdefault(x, []).append(eq)
    pending = deque(eq for eq in equations if len(unknowns[id(eq)]) == 1)
    while pending:
        eq = pending.popleft()
        left = unknowns[id(eq)]
        if len(left) != 1:
            continue
        u = next(iter(left))
        if any(t.count(u) > 1 for t in eq.terms):  # u^2: left to sympy
            continue
        known = sum(math.prod(sizes[x] for x in t) for t in eq.terms if u not in t)
        coeff = sum(math.prod(sizes[x] for x in t if x != u) for t in eq.terms if u in t)
        rest = eq.length - known
        if rest <= 0 or coeff <= 0 or rest % coeff:
            raise SpecError(f"cannot split axis of length {eq.length}: the other factors give "
                            f"{known} + {coeff} * size({display(u)}), which has no positive "
                            "integer solution" + _origins(eq, sizes, origin), file=source, key=eq.key,
                            param=eq.param, axis=eq.axis,
                            hint="check the segments and the declared sizes")
        sizes[u] = rest // coeff
        origin[u] = eq
        for other in using[u]:
            left = unknowns[id(other)]
            left.discard(u)
            if len(left) == 1:
                pending.append(other)


def _component(open_eqs: list[AxisEquation], sizes: Mapping[str, int]) -> set[str]:
    """The unknowns connected to the first open equation (equations sharing an unknown belong together)."""
    component: set[str] = set()
    frontier = {x for t in open_eqs[0].terms for x in t if x not in sizes}
    while frontier:
        component |= frontier
        frontier = {x for eq in open_eqs for t in eq.terms for x in t
                    if x not in sizes and not component.isdisjoint(y for s in eq.terms for y in s)} - component
    return component


def _inconsistency_elsewhere(equations: list[AxisEquation], open_eqs: list[AxisEquation], sizes: dict[str, int],
                             source: str, decl_of: Mapping[str, str] | None) -> SpecError | None:
    """The error of the system without the first open component, if it is inconsistent (not merely free)."""
    component = _component(open_eqs, sizes)
    rest = [eq for eq in equations if component.isdisjoint(x for t in eq.terms for x in t)]
    try:
        solve_sizes(rest, dict(sizes), source, decl_of)
    except SpecError as exc:
        if "cannot infer" not in str(exc):
            return exc
    return None


def _solve_jointly(open_eqs: list[AxisEquation], sizes: dict[str, int], origin: dict, source: str,
                   decl_of: Mapping[str, str]) -> None:
    """sympy on one connected set of unknowns (the first); raises unless it has exactly one solution."""
    component = _component(open_eqs, sizes)
    eqs = [eq for eq in open_eqs if not component.isdisjoint(x for t in eq.terms for x in t)]
    # sympy solves for the first symbols and leaves the last ones free: put last the sizes a user
    # would rather give (those in most axes and segments: head before d_head), so the hint names them
    names = sorted(component, key=lambda x: (sum(any(x in t for t in eq.terms) for eq in eqs),
                                             sum(t.count(x) for eq in eqs for t in eq.terms), x))
    symbols = {x: sympy.Symbol(f"s{i}", positive=True, integer=True) for i, x in enumerate(names)}
    exprs = [sympy.Add(*[sympy.Mul(*[symbols[x] if x in symbols else sizes[x] for x in t]) for t in eq.terms])
             - eq.length for eq in eqs]
    try:
        solutions = sympy.solve(exprs, list(symbols.values()), dict=True)
    except (NotImplementedError, ValueError):  # beyond sympy's polynomial solver: treat as open
        solutions = [{}]
    exact = [s for s in solutions if len(s) == len(symbols) and all(v.is_Integer and v > 0 for v in s.values())]
    open_ = [s for s in solutions if s not in exact]
    if open_ or len(exact) != 1:
        # a parametric family may still hold one positive-integer point (a * b = 1), and sympy's solver
        # under positivity assumptions can miss a point altogether: the search decides when it can
        points = _enumerate(names, eqs, sizes)
        if points is not None:
            found = [{symbols[x]: sympy.Integer(v) for x, v in p.items()} for p in points]
            if len(points) < 2:  # none or exactly one: the search's answer stands
                exact, open_ = found, []
            else:  # several: free, whatever sympy returned (it can miss points)
                exact = found
            solutions = exact + open_
    if len(exact) == 1 and not open_:
        for x, sym in symbols.items():
            sizes[x] = int(exact[0][sym])
            origin[x] = eqs[0]
        return
    back = {sym: x for x, sym in symbols.items()}
    if not solutions or (not exact and all(_fixed(s, symbols) for s in open_)):
        pair = " and ".join(eq.where() for eq in eqs[:2])
        raise SpecError(f"inconsistent sizes: no positive integer sizes of {few(map(display, names))} satisfy "
                        f"{pair}" + (f" and {len(eqs) - 2} more axes" if len(eqs) > 2 else ""),
                        file=source, key=eqs[-1].key, param=eqs[-1].param, axis=eqs[-1].axis,
                        hint="check the declared sizes and the segment split of these axes")
    free = sorted({back[s] for sol in open_ for s in symbols.values() if s not in sol}
                  | {back[s] for sol in open_ for v in sol.values() for s in v.free_symbols if s in back})
    if not free:  # several discrete solutions (a*b = 6 and a + b = 5): any unknown decides
        free = names
    spaces = [x for x in free if not x.startswith("_:")]
    mentions = [eq for eq in eqs if not set(free).isdisjoint(x for t in eq.terms for x in t)]
    axes = "; ".join(f"axis {eq.axis} of {eq.param!r}: {_equation(eq, sizes)}" for eq in mentions[:3])
    if len(mentions) > 3:
        axes += f"; ... {len(mentions) - 3} more"
    what = [display(x) for x in free]
    if spaces:
        give = decl_of.get(spaces[0], spaces[0])
        hint = (f"give the size of {give!r}: declare size = ... for it under [spaces], "
                f"or pass sizes={{{give!r}: ...}} (CLI: --size '{give}=...')")
    else:
        hint = "a fused axis may hold at most one free segment '_'; declare a space with a size for the others"
    eq = mentions[0] if mentions else eqs[0]
    raise SpecError(f"cannot infer the size of {few(what)}: the shapes leave them free ({axes})",
                    file=source, key=eq.key, param=eq.param, axis=eq.axis, hint=hint)


SEARCH_LIMIT = 200_000  # search nodes; beyond it a parametric solution counts as free


def _enumerate(names: list[str], eqs: list[AxisEquation], sizes: Mapping[str, int]) -> list[dict] | None:
    """Every positive-integer solution (at most 2 kept), by a depth-first search: each unknown is at most
    the length of an axis it appears in (all terms are positive); after each choice, an equation left
    with one unknown that enters it linearly decides that unknown, and an equation whose known part
    already exceeds its length prunes the branch. None when the search exceeds SEARCH_LIMIT nodes."""
    bounds = {x: min(eq.length for eq in eqs if any(x in t for t in eq.terms)) for x in names}
    found: list[dict] = []
    budget = [SEARCH_LIMIT]

    def settle(trial: dict[str, int]) -> bool:
        """Propagate single linear unknowns; False when an equation cannot hold."""
        changed = True
        while changed:
            changed = False
            for eq in eqs:
                unknown = {x for t in eq.terms for x in t if x not in trial}
                # every unknown is at least 1, so the known factors bound the total from below
                least = sum(math.prod(trial.get(x, 1) for x in t) for t in eq.terms)
                if least > eq.length or (not unknown and least != eq.length):
                    return False
                if len(unknown) != 1 or any(t.count(x) > 1 for t in eq.terms for x in unknown):
                    continue
                (u,) = unknown
                known = sum(math.prod(trial[x] for x in t) for t in eq.terms if u not in t)
                coeff = sum(math.prod(trial[x] for x in t if x != u) for t in eq.terms if u in t)
                rest = eq.length - known
                if rest <= 0 or rest % coeff or rest // coeff > bounds[u]:
                    return False
                trial[u] = rest // coeff
                changed = True
        return True

    def search(trial: dict[str, int]) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if not settle(trial):
            return True
        open_ = [x for x in names if x not in trial]
        if not open_:
            found.append({x: trial[x] for x in names})
            return len(found) < 2
        x = min(open_, key=lambda y: (bounds[y], y))
        return all(search({**trial, x: v}) for v in range(1, bounds[x] + 1))

    search(dict(sizes))
    return None if budget[0] < 0 else found


def _origins(eq: AxisEquation, sizes: Mapping[str, int], origin: Mapping) -> str:
    """Which other axes fixed the sizes this equation uses: the second axis of a disagreement."""
    others = [f"{display(x)}={sizes[x]} comes from {o.where()}" for t in eq.terms for x in t
              if x in sizes and (o := origin.get(x)) is not None and o != eq]
    return f" ({'; '.join(dict.fromkeys(others[:3]))})" if others else ""


def _fixed(solution: dict, symbols: dict) -> bool:
    """A solution with no free symbol that still is not a positive-integer point (e.g. dqk = 3/2)."""
    return len(solution) == len(symbols) and not any(v.free_symbols for v in solution.values())


def _equation(eq: AxisEquation, sizes: Mapping[str, int]) -> str:
    terms = [" * ".join(str(sizes[x]) if x in sizes else display(x) for x in t) for t in eq.terms]
    return f"{' + '.join(terms)} = {eq.length}"
