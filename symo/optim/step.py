"""The optimizer's step for the covered parameters, as functions of their tensors (docs/architecture.md):
Muon's momentum, then `directions`, the one loop over the passes a preconditioner kind asks for (gather ->
the kind on every block -> scatter), and `polar_step`, the polar kind's whole step as one graph for
torch.compile. `Symo._step_covered` (optimizer.py) calls them and writes nothing until they have returned."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..runtime.compiled import CompiledSpec, NonFiniteUpdateError
from . import parameter_rms
from .distributed import zeros_like_param
from .kinds.base import BlockStep, Kind, StepContext
from .plan import Stage

Tensors = dict[str, torch.Tensor]


def shared_beta1(betas: list[float], kind: Kind) -> float:
    """The covered groups' momentum as one value, for a kind that debiases it (Kind.debiases_momentum); the other
    kinds take beta1 per group (the momentum is per parameter)."""
    if kind.debiases_momentum and any(b != betas[0] for b in betas):
        raise ValueError(f"the covered parameter groups have different beta1 values {sorted(set(betas))}; the "
                         f"{kind.name} kind divides by the momentum's bias 1 - beta1^t per block, and a block may "
                         "span several groups, so it needs one beta1 for all of them")
    return betas[0]


def momentum(grads, bufs, betas, nesterovs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Muon's momentum: (the vectors to precondition, Nesterov blend or m; the new buffers), `bufs` untouched
    (the step writes the new buffers once it has succeeded)."""
    us, new = [], []
    for g, buf, beta, nest in zip(grads, bufs, betas, nesterovs):
        g = g.to(buf.dtype)
        m = buf.lerp(g, 1 - beta)
        new.append(m)
        us.append(g.lerp(m, beta) if nest else m)
    return us, new


def with_zeros(compiled: CompiledSpec, tensors: Tensors, like: torch.Tensor) -> Tensors:
    """Covered parameters without a gradient this step count as zero in their blocks."""
    if len(tensors) == len(compiled.param_names):
        return tensors
    out = dict(tensors)
    for n in compiled.param_names:
        if n not in out:
            out[n] = zeros_like_param(compiled.shapes[n], like)
    return out


def directions(plan: list[Stage], kind: Kind, ctx: StepContext, vectors: dict[str, Tensors],
               weights: Tensors | None, present: set[str],
               block_state: Callable[[int, Stage, str], dict[str, Any]],
               owned: list[set[str]] | None, rms_targets: dict[str, float] | None = None) -> Tensors:
    """The one loop: for each of the kind's passes, gather -> the kind on every block -> scatter.

    `vectors`: {"u": the vectors preconditioned, "g": the raw gradients when the kind asks for them};
    `present`: the parameters with a gradient (a block none of whose parameters has one is skipped, its
    update zero); `owned` (several processes): per stage, the blocks computed here; `rms_targets`: the
    parameters whose direction is rescaled to a given RMS at the end (symo.optim.parameter_rms)."""
    like = next(iter(vectors["u"].values()))
    carried = {key: vectors[key] for key in kind.carried}
    stat_key = kind.statistic_key()
    visited: dict[int, list[BlockStep]] = {}  # stage -> its blocks on the first visit
    scratch: dict[tuple[int, str], dict[str, Any]] = {}
    moved = False  # whether the carried vectors are still the raw ones
    for k, direction in kind.passes(len(plan)):
        stage = plan[k]
        comp = stage.compiled
        coords = {key: comp.gather(with_zeros(comp, v, like)) for key, v in carried.items()}
        first = k not in visited
        stats = weight = None
        if first:
            raw_is_carried = not moved and stat_key in coords
            stats = coords[stat_key] if raw_is_carried else comp.gather(with_zeros(comp, vectors[stat_key], like))
            if kind.needs_weights and weights is not None:
                weight = lazy_gather(comp, weights, like)
        steps: list[BlockStep] = []
        zs: dict[str, dict[str, torch.Tensor]] = {}
        for b in comp.blocks:
            c = stage.blocks[b.id]
            if present.isdisjoint(c.params) or (owned is not None and b.id not in owned[k]):
                for key in coords:
                    zs.setdefault(key, {})[b.id] = torch.zeros_like(coords[key][b.id])
                continue
            steps.append(BlockStep(
                c, block_state(k, stage, b.id) if kind.stateful else {}, {key: v[b.id] for key, v in coords.items()},
                None if stats is None else stats[b.id],
                None if weight is None else (lambda bid=b.id, weight=weight: weight()[bid]),
                scratch.setdefault((k, b.id), {})))
        if first:
            visited[k] = steps
        try:
            if first and steps:
                kind.update(k, steps, ctx)
                due = [s for s in steps if kind.due(k, s)]
                if due:
                    kind.refresh(k, due, ctx)
            outs = kind.apply(k, direction, steps, ctx) if steps else []
        except torch.linalg.LinAlgError as err:
            raise linalg_failure(kind, comp, vectors, err) from err
        keys = list(outs[0]) if outs else list(coords)
        for s, out in zip(steps, outs):
            for key in keys:
                zs.setdefault(key, {})[s.plan.id] = out[key]
        carried = {key: comp.scatter({bid: z for bid, z in zs.get(key, {}).items()}) for key in keys}
        moved = True
    for k, steps in visited.items():
        if steps:
            try:
                kind.after_step(k, steps, ctx)
            except torch.linalg.LinAlgError as err:
                raise linalg_failure(kind, plan[k].compiled, vectors, err) from err
    return parameter_rms.match_rms(carried["u"], rms_targets or {})


def check_finite_updates(updates: dict[str, torch.Tensor], kind: str) -> None:
    """NonFiniteUpdateError, before anything is written, when the step's direction of some parameter holds NaN
    or inf although its gradient was finite: one synchronisation for all of them."""
    shown = {n: u for n, u in updates.items() if u.numel()}
    if not shown:
        return
    peaks = torch.stack([u.detach().abs().amax().float() for u in shown.values()])
    if bool(torch.isfinite(peaks).all()):
        return
    bad = [n for n, peak in zip(shown, peaks.tolist()) if not math.isfinite(peak)]
    raise NonFiniteUpdateError(
        f"Symo's {kind} step produced NaN or inf in the update of {bad[:3]}{' and more' if len(bad) > 3 else ''} "
        "from finite gradients; the step changed nothing. The usual cause is a statistic that overflowed its dtype "
        "(float32 holds squares up to about 3e38, so gradient entries above about 1e19): clip the gradients, lower "
        "the loss scale, or pass stats_dtype='float64'")


def linalg_failure(kind: Kind, comp: CompiledSpec, vectors: dict[str, Tensors], err: Exception
                   ) -> NonFiniteUpdateError:
    """A matrix function that failed (eigh of a NaN or inf statistic), as the documented error: it names the
    parameter whose vector is not finite (check_finite=False let it in), or says the optimizer's numerics failed."""
    bad = [n for v in vectors.values() for n, t in v.items() if not bool(torch.isfinite(t).all())]
    if bad:
        return NonFiniteUpdateError(
            f"Symo's {kind.name} preconditioner could not decompose a statistic of spec {comp.name!r}: the "
            f"gradient or momentum of {sorted(set(bad))[:3]} holds NaN/inf (check_finite=False let it in); the "
            "step changed nothing: skip this batch, lower the learning rate, or keep check_finite=True")
    return NonFiniteUpdateError(
        f"Symo's {kind.name} preconditioner could not decompose a statistic of spec {comp.name!r} ({err}) from "
        "finite gradients; this is the optimizer's numerics, not your data: a statistic that overflowed float32 "
        "(gradient entries above about 1e19: clip them or lower the loss scale) or an ill-conditioned one. Use "
        "stats_dtype='float64', or add damping; the step changed nothing")


def lazy_gather(comp: CompiledSpec, tensors: Tensors, like: torch.Tensor) -> Callable[[], dict[str, torch.Tensor]]:
    """The block coordinates of `tensors`, gathered on the first call and kept."""
    cache: dict[str, dict[str, torch.Tensor]] = {}

    def get() -> dict[str, torch.Tensor]:
        if "coords" not in cache:
            cache["coords"] = comp.gather(with_zeros(comp, tensors, like))
        return cache["coords"]

    return get


def polar_step(plan: list[Stage], kind: Kind, ctx: StepContext, names, grads, bufs, betas, nesterovs,
               rms_targets: dict[str, float]) -> tuple[Tensors, list[torch.Tensor]]:
    """The polar kind's whole step, Python control flow static in the shapes and config (torch.compile takes
    it as one graph): momentum, then the one loop (no block state). Returns the directions and the new
    momentum buffers."""
    us_list, new_bufs = momentum(grads, bufs, betas, nesterovs)
    us = dict(zip(names, us_list))
    vectors = {"u": us}
    if "g" in kind.vectors():
        vectors["g"] = {n: g.to(us[n].dtype) for n, g in zip(names, grads)}
    return directions(plan, kind, ctx, vectors, None, set(names), lambda k, stage, bid: {}, None,
                      rms_targets), new_bufs
