"""Weight matching: the group element g that maximises sum_p <W_ref_p, (A_g W_other)_p> over the spec's group.

Git Re-Basin's weight matching (Ainsworth et al., ICLR 2023), generalised to every group Symo knows:
coordinate descent over the spaces. With every other space held at its current element, the objective
is linear in the element Q of one space, <Q, C>, where C is its gradient: per block of the parameters
the space acts on, the contraction of the reference's block with the other's block moved by every other
space (`CompiledSpec.act`), so the objective is exactly the one the compiled group action defines,
per-head (`per`) spaces and fused axes included (a test checks C against autograd through `act`). Then

- `perm`: C's linear assignment (scipy's `linear_sum_assignment`, maximising);
- `signed_perm`: the assignment of |C|, each match taking the sign of its C_ij;
- `orthogonal`: orthogonal Procrustes, Q = U V^T for C = U S V^T;
- a `per` space: one such solve per index of its owner (one element per head);
- a `perm` or `signed_perm` owner of `per` spaces (heads permuted as wholes, each with its own rotation): the
  heads and their per-spaces jointly. With the other spaces fixed, pairing result head a with head b of
  `other` is worth C0[a, b] (the blocks where the owner occurs alone) plus, per owned space, the best
  element's value on its cross matrix C[a, b] (for a rotation its nuclear norm: the Procrustes optimum). A
  linear assignment on that score picks the heads (for signed_perm each pair also its sign), then each pair
  its elements (Procrustes): the exact maximum over the owner and its per-spaces together, which a
  coordinate step on the owner alone would miss (`heads.update_owner`).

A space that occurs twice in one block (a repeated space: an RNN's W_hh moves as Q W Q^T) makes the objective
quadratic in Q. Its steps: the linearisation at the current Q (both occurrences' terms, each with the
other occurrence fixed), the terms where it occurs once, and damped linearisations; the best that
improves the true objective is kept, iterated until none does. Sweeps over all spaces stop when no
element moves by more than `tol`, when a sweep gains nothing, or after `max_sweeps`.

Starts: the identity; a "solo" start where some spaces have parameters no other space moves (embeddings,
norms, biases of a residual stream: each such space solved on those first, so that a wrong residual
permutation found against unsolved layers is not locked in); and `restarts` random group elements,
visiting the spaces in a random order per sweep, each drawn from its own generator (seed, start index). The
run with the largest objective is kept. Where heads are permuted as wholes (a perm owner solved jointly
with its per-spaces), every run first solves the subgroup with those owners held at the identity (heads
fixed in their slots, each rotated within it), then the whole group from there: from each start the
heads-permuted group ends at least as high as the heads-fixed group (random starts draw the same element
for both), and the head steps can lead the descent out of the residual permutation it settled on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ..runtime.compiled import CompiledSpec, _random_matrix
from .heads import update_owner
from .solve import solve_linear

Tensors = Mapping[str, torch.Tensor]


def identity_element(compiled: CompiledSpec, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The identity of the group: (copies, n, n) per space, copies = the owner's size for `per` spaces."""
    out = {}
    for s, info in compiled.spaces.items():
        copies = compiled.spaces[info["per"]]["size"] if info["per"] else 1
        out[s] = torch.eye(info["size"], dtype=dtype).expand(copies, -1, -1).clone()
    return out


def inner_products(compiled: CompiledSpec, element: Tensors, ref: Tensors, other: Tensors,
                   names: list[str] | None = None) -> dict[str, float]:
    """<W_ref_p, (A_g W_other)_p> per covered parameter p (accumulated in float64)."""
    names = compiled.param_names if names is None else names
    with torch.no_grad():
        moved = compiled.act(element, other, names)
        return {n: float((ref[n] * moved[n]).sum(dtype=torch.float64)) for n in names}


@dataclass
class Matching:
    """What weight matching found: `elements` {space: (copies, n, n)} in the working dtype, the objective
    at the identity and at the end, the sweeps of the winning run and where it started ("identity",
    "solo", "random k"), per space the last sweep that changed its element (0: no sweep changed it, so it
    is its start's element), and whether the run converged (False: it stopped at `max_sweeps`)."""

    elements: dict[str, torch.Tensor]
    objective_before: float
    objective_after: float
    sweeps: int
    start: str
    history: list[float] = field(default_factory=list)
    last_changed: dict[str, int] = field(default_factory=dict)
    converged: bool = True


def weight_matching(compiled: CompiledSpec, ref: Tensors, other: Tensors, *, fixed: Tensors | None = None,
                    max_sweeps: int = 100, tol: float | None = None, restarts: int = 0, seed: int = 0,
                    progress: bool = False) -> Matching:
    """Maximise sum_p <ref_p, (A_g other_p)> over the group by coordinate descent (module docstring).

    `ref`, `other`: {name: tensor} of the covered parameters, in one floating dtype. `fixed`: elements of
    spaces that are not solved here ((copies, n, n), e.g. found by activation matching). The sweeps stop
    when no element entry moved by more than `tol` (default 1000 machine epsilons of the dtype), when a
    sweep gains nothing, or after `max_sweeps` (`converged` False). `progress`: a bar on stderr counting
    one sweep's spaces, shown only where stderr is a terminal."""
    from tqdm.auto import tqdm  # the progress bar is optional decoration; imported where it is shown

    dtype = next(iter(ref.values())).dtype
    tol = 1e3 * torch.finfo(dtype).eps if tol is None else tol
    base = identity_element(compiled, dtype)
    fixed = dict(fixed or {})
    base.update({s: q.to(dtype) for s, q in fixed.items()})
    solve = [s for s, info in compiled.spaces.items()
             if info["group"] != "identity" and compiled.space_params[s] and s not in fixed]
    repeated = repeated_spaces(compiled, compiled.param_names)
    start_total = sum(inner_products(compiled, base, ref, other).values())
    # heads permuted as wholes: each run first solves the subgroup with those owners held at the identity (the
    # heads fixed in their slots, each rotated within it), then the whole group from there
    staged = [s for s in solve if joint_spaces(compiled, s, solve)]
    best: Matching | None = None
    starts = ["identity"] + (["solo"] if any(_solo(compiled, s) for s in solve) else [])
    starts += [f"random {k + 1}" for k in range(restarts)]
    # disable=None: tqdm's off switch where stderr is not a terminal (a log file gets no bar lines)
    bar = tqdm(total=len(solve), desc="align", unit="space", disable=None if progress else True, leave=False)
    try:
        for k, start in enumerate(starts):
            element = dict(base)
            # one generator per start (seed, start's index): a random start's element and sweep orders do not
            # depend on what the starts before it drew, nor on whether head owners are staged
            gen = torch.Generator().manual_seed(seed * 1_000_003 + k) if start.startswith("random") else None
            if start == "solo":
                element.update({s: q for s, q in _solo_start(compiled, element, solve, ref, other).items()
                                if s not in staged})
            elif gen is not None:
                element.update(_random_start(compiled, solve, staged, gen, dtype))
            total = sum(inner_products(compiled, element, ref, other).values()) if start != "identity" \
                else start_total
            if staged:
                first = [s for s in solve if s not in staged]
                held = _descend(compiled, element, ref, other, first, repeated, total, max_sweeps, tol, gen, bar,
                                start)
                element, total = held.elements, held.objective_after
            # max_sweeps bounds a run: the whole group gets what the subgroup left (at least one sweep)
            left = max_sweeps - held.sweeps if staged else max_sweeps
            result = _descend(compiled, element, ref, other, solve, repeated, total, max(left, 1), tol, gen, bar,
                              start)
            if staged:
                result.sweeps += held.sweeps
                result.history = held.history + result.history[1:]
                result.last_changed = {s: held.last_changed.get(s, 0) if v == 0 else v + held.sweeps
                                       for s, v in result.last_changed.items()}
            result.objective_before, result.start = start_total, start
            if best is None or result.objective_after > best.objective_after:
                best = result
    finally:
        bar.close()
    assert best is not None
    return best


def _random_start(compiled: CompiledSpec, solve: list[str], staged: list[str], gen: torch.Generator,
                  dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A random element of the solved spaces, drawn space by space in the spec's order; the `staged` head owners
    stay at the identity (drawing nothing), so a spec with heads fixed and its heads-permuted variant draw the
    same start."""
    out = {}
    for s, info in compiled.spaces.items():
        if s not in solve or s in staged:
            continue
        copies = compiled.spaces[info["per"]]["size"] if info["per"] else 1
        out[s] = torch.stack([_random_matrix(info["group"], info["size"], gen, dtype) for _ in range(copies)])
    return out


def _solo(compiled: CompiledSpec, s: str) -> list[str]:
    """The parameters on which `s` is the only moving space, occurring once: their part of the objective
    does not depend on any other space's element."""
    out = []
    for n in compiled.space_params[s]:
        atoms = [sp for b in compiled.param_blocks(n) for axis in b["axes"] for sp, _ in axis
                 if sp is not None and compiled.spaces[sp]["group"] != "identity"]
        if all(sp == s for sp in atoms) and all(
                [sp for axis in b["axes"] for sp, _ in axis].count(s) <= 1 for b in compiled.param_blocks(n)):
            out.append(n)
    return out


def _solo_start(compiled: CompiledSpec, element: dict[str, torch.Tensor], solve: list[str], ref: Tensors,
                other: Tensors) -> dict[str, torch.Tensor]:
    """A start from the evidence that needs no other element: each space solved on its `_solo` parameters
    (a residual stream's embeddings, norms and biases), the rest at the identity. Coordinate descent from
    the identity can lock in a wrong residual permutation that every layer then follows."""
    out = {}
    for s in solve:
        names = _solo(compiled, s)
        if names:
            out[s] = _solve(compiled.spaces[s]["group"], _gradient(compiled, element, s, ref, other, names))
    return out


def _descend(compiled: CompiledSpec, element: dict[str, torch.Tensor], ref: Tensors, other: Tensors,
             solve: list[str], repeated: set[str], total: float, max_sweeps: int, tol: float,
             shuffle: torch.Generator | None, bar, start: str) -> Matching:
    history = [total]
    last_changed = {s: 0 for s in solve}
    owned = {s: joint_spaces(compiled, s, solve) for s in solve}
    sweeps, converged = 0, False
    for sweep in range(1, max_sweeps + 1):
        sweeps = sweep
        bar.reset()
        bar.set_description_str(f"align ({start} start), sweep {sweep}")
        order = solve if shuffle is None else [solve[i] for i in torch.randperm(len(solve), generator=shuffle)]
        gain, moved = 0.0, 0.0
        for s in order:
            before = {t: element[t] for t in [s, *owned[s]]}
            gain += _update(compiled, element, s, ref, other, s in repeated, owned[s])
            for t, previous in before.items():
                change = float((element[t] - previous).abs().max())
                if change > 0:
                    moved = max(moved, change)
                    last_changed[t] = sweep
            bar.update(1)
        total += gain
        history.append(total)
        bar.set_postfix_str(f"objective {total:.6g}")
        if moved <= tol or gain <= 0:
            converged = True
            break
    # the running total adds up exact local gains; measure the end once (rounding, the steps on repeated spaces)
    final = sum(inner_products(compiled, element, ref, other).values())
    return Matching(element, history[0], final, sweeps, "identity", history, last_changed, converged)


def _gradient(compiled: CompiledSpec, element: dict[str, torch.Tensor], s: str, ref: Tensors,
              other: Tensors, names: list[str]) -> torch.Tensor:
    """C = d/dQ_s sum_p <ref_p, (A_g other)_p> over the parameters `names` (the other spaces fixed).

    Where s occurs once in every block the objective is <Q_s, C> with C = sum over blocks of
    R_(k) Y_(k)^T (R: ref's block, Y: other's block moved by every other space, k: s's atom), one
    contraction per block; otherwise (a repeated space) autograd through `CompiledSpec.act`."""
    if s not in repeated_spaces(compiled, names) and not moving_per_spaces(compiled, s):
        return _contraction(compiled, element, s, ref, other, names)
    # a repeated space, or an owner whose per-spaces act after it (CompiledSpec.act): autograd through act
    return _autograd_gradient(compiled, element, s, ref, other, names)


def moving_per_spaces(compiled: CompiledSpec, s: str) -> list[str]:
    """The spaces declared per `s` that a group moves, where `s` itself has a group (perm, signed_perm): heads
    permuted as wholes, each carrying its own element of these spaces."""
    if compiled.spaces[s]["group"] == "identity":
        return []
    return [t for t, info in compiled.spaces.items() if info["per"] == s and info["group"] != "identity"]


def joint_spaces(compiled: CompiledSpec, s: str, solve: list[str]) -> list[str]:
    """The per-spaces solved jointly with owner `s` (`heads.update_owner`): all of its moving per-spaces when every
    one is being solved here, else none (one fixed by activation matching: the owner is then solved alone)."""
    owned = moving_per_spaces(compiled, s)
    return owned if owned and all(t in solve for t in owned) else []


def repeated_spaces(compiled: CompiledSpec, names: list[str]) -> set[str]:
    """Spaces that occur twice in one block of these parameters (the objective is quadratic there)."""
    out = set()
    for n in names:
        for block in compiled.param_blocks(n):
            atoms = [sp for axis in block["axes"] for sp, _ in axis if sp is not None]
            out.update(sp for sp in atoms if atoms.count(sp) > 1)
    return out


def _contraction(compiled: CompiledSpec, element: dict[str, torch.Tensor], s: str, ref: Tensors, other: Tensors,
                 names: list[str]) -> torch.Tensor:
    q = element[s]
    moved = compiled.act({**element, s: torch.eye(q.shape[-1], dtype=q.dtype).expand_as(q)}, other, names)
    c = torch.zeros_like(q)
    owner = compiled.spaces[s]["per"]
    for n in names:
        for block in compiled.param_blocks(n):
            atoms = [sp for axis in block["axes"] for sp, _ in axis]
            if s not in atoms:
                continue
            sizes = [size for axis in block["axes"] for _, size in axis]
            r, y = ref[n], moved[n]
            for axis, (start, length) in enumerate(block["slices"]):
                r, y = r.narrow(axis, start, length), y.narrow(axis, start, length)
            r, y = r.reshape(sizes), y.reshape(sizes)
            k = atoms.index(s)
            if owner is None:
                rest = [a for a in range(len(sizes)) if a != k]
                c[0] += torch.tensordot(r, y, dims=(rest, rest))
            else:  # one (n, n) block per index of the owner atom j
                j = atoms.index(owner)
                r = torch.movedim(r, (j, k), (0, 1)).reshape(sizes[j], sizes[k], -1)
                y = torch.movedim(y, (j, k), (0, 1)).reshape(sizes[j], sizes[k], -1)
                c += torch.bmm(r, y.transpose(1, 2))
    return c


def _autograd_gradient(compiled: CompiledSpec, element: dict[str, torch.Tensor], s: str, ref: Tensors,
                       other: Tensors, names: list[str]) -> torch.Tensor:
    q = element[s].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        moved = compiled.act({**element, s: q}, other, names)
        local = sum((ref[n].detach() * moved[n]).sum() for n in names)
        (grad,) = torch.autograd.grad(local, q)
    return grad.detach()


def _update(compiled: CompiledSpec, element: dict[str, torch.Tensor], s: str, ref: Tensors, other: Tensors,
            quadratic: bool, owned: list[str] | None = None, inner: int = 20) -> float:
    """Solve space `s` with the others fixed (an owner with the spaces `owned` per it: those too); returns the
    objective's gain (0: elements kept)."""
    group = compiled.spaces[s]["group"]
    names = compiled.space_params[s]
    if owned and not quadratic:
        gain = update_owner(compiled, element, s, owned, ref, other)
        if gain is not None:
            return gain
    if not quadratic:  # linear in Q_s: the part of the objective that moves with Q_s is <Q_s, C> exactly
        c = _gradient(compiled, element, s, ref, other, names)
        new = _solve(group, c)
        current, value = float((element[s].double() * c.double()).sum()), float((new.double() * c.double()).sum())
        # Procrustes is the exact maximiser: take it (a rounding-level loss is no reason to stay); an
        # assignment only when strictly better, so ties do not cycle
        better = value >= current if group == "orthogonal" else value > current + 1e-13 * max(abs(current), 1e-30)
        if better and math.isfinite(value):
            element[s] = new
            return max(value - current, 0.0)
        return 0.0
    # Quadratic: candidates from the linearisation at the current Q (both occurrences' terms, each with the
    # other occurrence fixed) and from the parameters where s occurs once (the terms that do not depend on
    # the current Q: what finds the element when the recurrent term, linearised at a wrong Q, misleads).
    once = [n for n in names if n not in _twice(compiled, s)]
    gained = 0.0
    current = sum(inner_products(compiled, element, ref, other, names).values())
    for _ in range(inner):
        c = _gradient(compiled, element, s, ref, other, names)
        steps = [c]
        if once:
            steps.append(_gradient(compiled, element, s, ref, other, once))
        # Damped steps: maximising <C + lam Q0, Q> maximises a minorant of the objective for lam at least
        # its curvature (||Q - Q0||^2 = 2n - 2 <Q, Q0> on the group), so some lam always improves it.
        scale = float(torch.linalg.matrix_norm(c.double(), ord=2).max())
        steps += [c + lam * scale * element[s] for lam in (1 / 16, 1 / 4, 1.0, 4.0)]
        best, best_value = None, current
        for step in steps:
            q = _solve(group, step)
            value = sum(inner_products(compiled, {**element, s: q}, ref, other, names).values())
            if math.isfinite(value) and value > best_value:
                best, best_value = q, value
        if best is None:
            break
        element[s] = best
        gained += best_value - current
        current = best_value
    return gained


def _solve(group: str, c: torch.Tensor) -> torch.Tensor:
    """One solve per copy (per index of the owner for a `per` space)."""
    return torch.stack([solve_linear(group, c[i].cpu()) for i in range(c.shape[0])]).to(c.device)


def _twice(compiled: CompiledSpec, s: str) -> set[str]:
    """The parameters with a block in which space `s` occurs twice."""
    return {n for n in compiled.space_params[s] if s in repeated_spaces(compiled, [n])}
