"""benchmarks/align.py's transformer helpers: a spec's heads fixed or permuted as wholes, how many heads an
alignment moves, and why weight matching's heads-permuted row can end above its heads-fixed row (the permuted
result taken apart into the heads-fixed result and one exact head step per layer)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math

import torch
from torch import nn

import symo
from symo.alignment import barrier
from symo.alignment.heads import head_pair_terms
from symo.alignment.matching import inner_products, moving_per_spaces, weight_matching
from symo.alignment.solve import best_values, solve_heads

ALPHAS = 11  # points on the straight path between two models


def heads_as(spec: symo.Spec, group: str) -> symo.Spec:
    """`spec` with every head owner (a space some `per` space names) declared `group`: "identity" keeps each
    head in its slot (rotated within it), "perm" permutes heads as wholes, each with its own rotations."""
    owners = {d.per for d in spec.spaces if d.per}
    spaces = tuple(dataclasses.replace(d, group=group) if d.name in owners else d for d in spec.spaces)
    return symo.Spec(name=f"{spec.name}, heads {group}", spaces=spaces, params=spec.params, source=spec.source)


def heads_moved(result) -> tuple[int, int]:
    """How many heads the element found moves to another slot, of how many (0 for identity owners)."""
    owners = {s.per for s in result.spaces if s.per}
    moved = total = 0
    for name in owners:
        perm = result.elements.get(name)
        size = result.compiled.spaces[name]["size"]
        total += size
        if perm is not None and result.compiled.spaces[name]["group"] == "perm":
            moved += int((torch.as_tensor(perm) != torch.arange(size)).sum())
    return moved, total


def moved_model(model: nn.Module, compiled, elements: dict) -> nn.Module:
    """A copy of `model` moved by `elements` ({space: (copies, n, n)}) with the compiled spec's group action."""
    params = dict(model.named_parameters())
    moved = compiled.act(elements, {n: params[n].detach() for n in compiled.param_names})
    out = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in out.named_parameters():
            if n in moved:
                p.copy_(moved[n])
    return out


def pairing(q: torch.Tensor) -> list[int]:
    """A head owner's permutation matrix (n, n) as a list: result slot i holds `other`'s head [i]."""
    return [int(j) for j in q.abs().argmax(-1)]


def heads_diagnostics(a: nn.Module, b: nn.Module, loss_fn, test: list, fixed, permuted, act,
                      residual: str = "res") -> dict:
    """Why weight matching's heads-permuted row can end above its heads-fixed row, measured on the pair.

    `fixed`, `permuted`: weight matching's AlignResults with identity and with perm head owners (one spec
    otherwise); `act`: activation matching's with perm owners. Per head owner (one per layer): the heads its
    exact joint step (symo.alignment's head_pair_terms and solve_heads: a linear assignment of head
    pairs, then Procrustes per pair) moves when taken from the heads-fixed result with every other element
    held, the objective gain and the barrier of that step alone, and the rank (1: the best of all n!
    pairings) under the weight score at the heads-permuted result of keeping heads in place and of
    activation matching's pairing. Then: whether the heads-permuted result is exactly the heads-fixed result
    followed by those steps; objective and barrier with activation matching's head pairing (the rest by
    weights); and both groups' objective and barrier with activation matching's `residual` permutation (the
    rest by weights)."""
    compiled = permuted.compiled
    dtype = permuted.matrices[next(iter(permuted.matrices))].dtype
    ref = {n: p.detach().to(dtype) for n, p in a.named_parameters() if n in compiled.param_names}
    other = {n: p.detach().to(dtype) for n, p in b.named_parameters() if n in compiled.param_names}
    owners = [s for s in compiled.spaces if moving_per_spaces(compiled, s)]

    def objective(elements: dict) -> float:
        return sum(inner_products(compiled, elements, ref, other).values())

    def path(elements: dict, spec=None) -> float:
        return barrier(a, moved_model(b, spec or compiled, elements), loss_fn, test, ALPHAS).barrier("loss")

    def rank(score: torch.Tensor, p: list[int]) -> int | None:
        n = score.shape[0]
        if n > 8:  # 8! pairings at most
            return None
        value = float(score[torch.arange(n), torch.as_tensor(p)].sum())
        others = (float(score[torch.arange(n), torch.as_tensor(r)].sum()) for r in itertools.permutations(range(n)))
        return 1 + sum(v > value + 1e-9 * abs(value) for v in others)

    start = {s: q.to(dtype) for s, q in fixed.matrices.items()}
    base = objective(start)
    stepped, layers = dict(start), {}
    for owner in owners:
        owned = moving_per_spaces(compiled, owner)
        groups = {t: compiled.spaces[t]["group"] for t in owned}
        c0, cross = head_pair_terms(compiled, start, owner, owned, ref, other)
        q, rotations, _ = solve_heads(compiled.spaces[owner]["group"], c0, {t: (groups[t], cross[t]) for t in owned})
        step = {owner: q.to(dtype).unsqueeze(0), **{t: r.to(dtype) for t, r in rotations.items()}}
        stepped.update(step)
        moved = pairing(q)
        alone = {**start, **step}
        c0, cross = head_pair_terms(compiled, permuted.matrices, owner, owned, ref, other)
        score = c0 + sum(best_values(groups[t], cross[t]) for t in owned)
        layers[owner] = {"heads": moved, "gain": objective(alone) - base,
                         "barrier": path(alone) if moved != sorted(moved) else None,
                         "rank_in_place": rank(score, list(range(len(moved)))),
                         "activations": pairing(act.matrices[owner][0]),
                         "rank_activations": rank(score, pairing(act.matrices[owner][0])),
                         "pairings": math.factorial(len(moved))}
    rest = [s for s in compiled.spaces if s not in owners and compiled.spaces[s]["per"] not in owners]
    same = all(torch.equal(stepped[s], permuted.matrices[s].to(dtype)) for s in rest + owners) and all(
        torch.allclose(stepped[t], permuted.matrices[t].to(dtype), atol=1e-5) for o in owners
        for t in moving_per_spaces(compiled, o))
    heads_act = weight_matching(compiled, ref, other, fixed={o: act.matrices[o].to(dtype) for o in owners})
    out = {"layers": layers, "fixed_then_heads_step": same, "fixed_objective": base,
           "permuted_objective": permuted.objective_after,
           "heads_from_activations": {"objective": heads_act.objective_after, "barrier": path(heads_act.elements)}}
    if residual in compiled.spaces and residual in act.matrices:
        located = {residual: act.matrices[residual].to(dtype)}
        for label, result in (("fixed", fixed), ("permuted", permuted)):
            m = weight_matching(result.compiled, ref, other, fixed=located)
            out[f"residual_from_activations_{label}"] = {"objective": m.objective_after,
                                                         "barrier": path(m.elements, result.compiled)}
    return out


def heads_note(a: nn.Module, b: nn.Module, loss_fn, test: list, out: dict, results: dict, fixed: str, permuted: str,
               act: str) -> str:
    """heads_diagnostics for the rows `fixed`, `permuted` (weight matching) and `act` (activation matching): kept
    in the permuted row (align.json) and returned in words."""
    d = heads_diagnostics(a, b, loss_fn, test, results[fixed], results[permuted], results[act])
    out[permuted]["heads_diagnostics"] = d
    return heads_text(d, out[fixed]["barrier_loss"], out[permuted]["barrier_loss"])


def heads_text(d: dict, fixed_barrier: float, permuted_barrier: float) -> str:
    """heads_diagnostics in words, for the case's note (every comparison worded from the numbers)."""
    gain = d["permuted_objective"] - d["fixed_objective"]
    same = d["fixed_then_heads_step"]
    text = (f"Heads permuted against heads fixed (weight matching): the heads-permuted result "
            f"{'is exactly' if same else 'is not'} the heads-fixed result followed by one exact head step per layer "
            f"(the linear assignment of head pairs, every other element held"
            f"{': the residual and MLP permutations are the same' if same else ''}); the permuted group raises the "
            f"objective by {gain:.4f} ({100 * gain / abs(d['fixed_objective']):.3f}%) and moves the barrier from "
            f"{fixed_barrier:.4f} to {permuted_barrier:.4f}. Per layer, the heads each slot takes, the step's "
            f"objective gain and the barrier with that layer's step alone, then the rank (1: best) of keeping heads "
            f"in place and of activation matching's pairing among all pairings under the weight score: ")
    text += "; ".join(
        f"{o} {v['heads']} ({(v['gain'] if abs(v['gain']) >= 5e-5 else 0.0):+.4f}, "
        + (f"barrier {v['barrier']:.4f}" if v["barrier"] is not None else "no head moved")
        + f"; in place {v['rank_in_place']}, activations' {v['activations']} {v['rank_activations']} "
        f"of {v['pairings']})"
        for o, v in d["layers"].items()) + "."
    h = d["heads_from_activations"]
    text += (f" With activation matching's head pairing and the rest by weights: objective {h['objective']:.3f} "
             f"({'lower' if h['objective'] < d['permuted_objective'] else 'not lower'} than the permuted group's), "
             f"barrier {h['barrier']:.4f}.")
    if "residual_from_activations_fixed" in d:
        f, p = d["residual_from_activations_fixed"], d["residual_from_activations_permuted"]
        higher = f["objective"] > d["fixed_objective"] and p["objective"] > d["permuted_objective"]
        text += (f" With activation matching's residual permutation and the rest by weights: objective "
                 f"{f['objective']:.3f} (heads fixed) and {p['objective']:.3f} (permuted), "
                 f"{'both higher than' if higher else 'not both higher than'} weight matching's own descent reaches, "
                 f"barriers {f['barrier']:.4f} and {p['barrier']:.4f}.")
    return text
