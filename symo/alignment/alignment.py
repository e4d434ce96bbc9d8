"""`symo.align(reference, other, spec)`: move `other` by the element of the spec's group that matches it
to `reference` best, with weight matching (matching.py) or activation matching (activations.py).

The element is applied with the compiled spec's own group action (`CompiledSpec.act`), so the result is
exactly `other` moved by a group element: where the spec is a true symmetry (`symo check` says which),
it computes `other`'s function. BatchNorm running statistics follow their layer's weight (mean by the
element, variance by its absolute value; a rotation cannot carry a variance, and the result says so).
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..compiler import Spec, SpecError, load_spec
from ..infer import check_spec, infer
from ..runtime.compiled import CompiledSpec, compile, compile_for
from .activations import activation_matching
from .matching import identity_element, inner_products, weight_matching
from .result import AlignError, AlignResult, AlignWarning, SpaceReport, readable_elements

METHODS = ("weights", "activations")
INPUTS_HINT = ("pass example_inputs= to symo.align (CLI: --input-shape, e.g. --input-shape 2x1x28x28 for one float "
               "batch), or give the model an example_inputs() method that returns them")


def align(reference: nn.Module | Mapping[str, torch.Tensor], other: nn.Module | Mapping[str, torch.Tensor],
          spec: Spec | CompiledSpec | str | Path | None = None, *, method: str = "weights",
          data: Iterable[Any] | None = None, sizes: dict[str, int] | None = None, example_inputs: Any = None,
          check: bool = True, max_sweeps: int = 100, tol: float | None = None, restarts: int = 0, seed: int = 0,
          progress: bool = False, strict: bool = True) -> AlignResult:
    """Align `other` to `reference` modulo the spec's group; returns an `AlignResult`.

    - `reference`, `other`: two models of one architecture (`nn.Module`s or state dicts).
    - `spec`: a path, a bundled name, a `Spec` or a `CompiledSpec`; None infers it from `reference` and
      verifies it numerically, as `symo infer` does (needs modules).
    - `method`: "weights" (maximise sum <W_ref, g W_other> over the group) or "activations" (match the
      hidden units' activations on `data`, an iterable of batches; spaces not found in the forward pass
      are then matched by weights).
    - `sizes`: space sizes the shapes leave open (as in `symo.compile`); `example_inputs`: for inferring
      and checking the spec (default: guessed as `symo infer` does).
    - `check`: measure, as `symo check` does, which spaces are true symmetries; a relaxed one gets an
      `AlignWarning` (the aligned model then computes another function).
    - `max_sweeps`, `tol`, `restarts`, `seed`: the coordinate descent's limits and random restarts
      (`AlignResult.converged` is False, and a note says so, when it stopped at `max_sweeps`). Each start
      is a run; the best objective is kept. Coupled spaces (a transformer's residual stream) have many local
      optima: `restarts` of 16 to 128 find better ones at that many times the time (docs/align.md).
    - `progress`: a progress bar on stderr where it is a terminal.
    - `strict=False`: drop the spec's rules that match no parameter (as `symo.compile`; CLI: --partial).
    """
    t0 = time.perf_counter()
    if method not in METHODS:
        raise AlignError(f"method must be one of {METHODS}, got {method!r}")
    for name, value, least in (("restarts", restarts, 0), ("max_sweeps", max_sweeps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise AlignError(f"{name} must be an integer >= {least} (CLI: --{name.replace('_', '-')}), got {value!r}")
    modules = isinstance(reference, nn.Module) and isinstance(other, nn.Module)
    if method == "activations" and (data is None or not modules):
        raise AlignError("method='activations' needs both models as nn.Modules and data=<iterable of input batches>; "
                         "or use method='weights'")
    ref_t, other_t = _tensors(reference, "reference"), _tensors(other, "other")
    _same_shapes(ref_t, other_t)
    compiled, inferred = _compiled(spec, reference, ref_t, sizes, example_inputs, strict)
    seconds = {"spec": time.perf_counter() - t0}
    notes: list[str] = []
    relaxed: list[str] = []
    if inferred:
        notes.append("spec inferred from the model and verified in float64 (symo infer): every space is true")
    elif check:
        t1 = time.perf_counter()
        relaxed = _relaxed(spec, reference, sizes, example_inputs, strict, notes) if modules else []
        if not modules:
            notes.append("symmetry not checked (state dicts, no model to run): run `symo check` on the spec")
        seconds["check"] = time.perf_counter() - t1
        if relaxed:
            warnings.warn(f"spec {compiled.name!r}: {len(relaxed)} space(s) are not true symmetries of the model "
                          f"({', '.join(relaxed[:6])}{', ...' if len(relaxed) > 6 else ''}): the aligned model "
                          "computes a different function there (as `symo compile` warns; `symo check` measures it)",
                          AlignWarning, stacklevel=2)

    dtype = torch.float64 if any(ref_t[n].dtype == torch.float64 for n in compiled.param_names) else torch.float32
    ref_w = {n: ref_t[n].detach().to(dtype) for n in compiled.param_names}
    other_w = {n: other_t[n].detach().to(dtype) for n in compiled.param_names}
    t1 = time.perf_counter()
    located: dict[str, torch.Tensor] = {}
    if method == "activations":
        located, _ = activation_matching(compiled, reference, other, data)
        located = {s: q.to(dtype) for s, q in located.items()}
        seconds["activations"] = time.perf_counter() - t1
        t1 = time.perf_counter()
    match = weight_matching(compiled, ref_w, other_w, fixed=located, max_sweeps=max_sweeps, tol=tol,
                            restarts=restarts, seed=seed, progress=progress)
    seconds["match"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    if not match.converged:
        notes.append(f"the coordinate descent stopped at max_sweeps={max_sweeps} before converging: a larger "
                     "max_sweeps (CLI: --max-sweeps) may find a better element")
    model = _moved(compiled, match.elements, other, other_t, notes)
    seconds["apply"] = time.perf_counter() - t1
    identity = identity_element(compiled, dtype)
    before = inner_products(compiled, identity, ref_w, other_w)
    after = inner_products(compiled, match.elements, ref_w, other_w)
    norms = {n: (float(ref_w[n].double().norm()) ** 2, float(other_w[n].double().norm()) ** 2) for n in ref_w}
    spaces = []
    for s, info in compiled.spaces.items():
        params = compiled.space_params[s]
        if info["group"] == "identity" or not params:
            continue
        scale = (sum(norms[n][0] for n in params) * sum(norms[n][1] for n in params)) ** 0.5 or 1.0
        spaces.append(SpaceReport(s, info["group"], info["size"], info["per"], match.elements[s].shape[0],
                                  "activations" if s in located else "weights", sum(before[n] for n in params) / scale,
                                  sum(after[n] for n in params) / scale, match.last_changed.get(s, 0),
                                  bool(torch.equal(match.elements[s], identity[s]))))
    seconds["total"] = time.perf_counter() - t0
    return AlignResult(model, readable_elements(compiled, match.elements), match.elements, compiled, method, spaces,
                       sum(before.values()), sum(after.values()), match.sweeps, match.start, seconds, relaxed, notes,
                       match.converged)


def _tensors(x: Any, label: str) -> dict[str, torch.Tensor]:
    """A model's parameters {name: tensor} (a module's named_parameters, or a state dict's tensors)."""
    if isinstance(x, nn.Module):
        return {n: p.detach() for n, p in x.named_parameters()}
    if isinstance(x, Mapping):
        bad = [k for k, v in x.items() if not isinstance(v, torch.Tensor)]
        if bad or not x:
            raise AlignError(f"{label} is not a model: expected an nn.Module or a state dict {{name: tensor}}, got a "
                             f"mapping {'with no entries' if not x else f'whose entry {bad[0]!r} is not a tensor'}")
        return dict(x)
    raise AlignError(f"{label} is not a model: expected an nn.Module or a state dict {{name: tensor}}, got "
                     f"{type(x).__name__}")


def _same_shapes(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> None:
    only_a, only_b = [n for n in a if n not in b], [n for n in b if n not in a]
    if only_a or only_b:
        which = f"{only_a[0]!r} is only in reference" if only_a else f"{only_b[0]!r} is only in other"
        raise AlignError(f"the two models have different parameters: {which} ({len(only_a)} only in reference, "
                         f"{len(only_b)} only in other); align two models of the same architecture")
    for n in a:
        if tuple(a[n].shape) != tuple(b[n].shape):
            raise AlignError(f"the two models have different shapes: {n!r} is {tuple(a[n].shape)} in reference and "
                             f"{tuple(b[n].shape)} in other; align two models of the same architecture and width")


def _compiled(spec: Any, reference: Any, ref_t: Mapping[str, torch.Tensor], sizes: dict[str, int] | None,
              example_inputs: Any, strict: bool = True) -> tuple[CompiledSpec, bool]:
    shapes = {n: tuple(t.shape) for n, t in ref_t.items()}
    if spec is None:
        if not isinstance(reference, nn.Module):
            raise AlignError("spec=None infers the spec from the model, which needs nn.Modules; with state dicts pass "
                             "spec= (a path, a bundled name or a Spec)")
        try:
            result = infer(_batch_statistics(reference), example_inputs)
        except (SpecError, AlignError):
            raise
        except Exception as exc:  # the user's model did not run on the inputs: say which and what to give
            raise AlignError(f"spec=None infers the spec by running the model on "
                             f"{'guessed' if example_inputs is None else 'the given'} example inputs, which failed "
                             f"({type(exc).__name__}: {str(exc)[:200]}): {INPUTS_HINT}; or give a spec") from exc
        compiled = compile(result.spec, shapes, sizes=sizes)
        if not compiled.param_names:
            raise AlignError("the inferred spec moves no parameter of the model (symo infer finds no symmetry "
                             "group): there is nothing to align; see `symo infer --model ...` for why")
        return compiled, True
    if isinstance(spec, CompiledSpec):
        return compile_for(spec, shapes, None), False
    spec = load_spec(spec) if not isinstance(spec, Spec) else spec
    try:
        return compile(spec, shapes, sizes=sizes, strict=strict), False
    except SpecError as exc:
        if exc.key is not None and exc.key.endswith(".per") or not _covers_nothing(spec, shapes, sizes):
            raise  # an owner's group, say: the compiler's own reason
    raise AlignError(f"spec {spec.name!r} ({spec.source}) covers none of the models' parameters (e.g. "
                     f"{', '.join(list(shapes)[:3])}): give the spec written for this model (`symo params` "
                     "lists the names a spec matches), or spec=None to infer one")


def _covers_nothing(spec: Spec, shapes: Mapping[str, tuple[int, ...]], sizes: dict[str, int] | None) -> bool:
    """No rule of the spec matches any parameter (the compiler's own check, with strict=False)."""
    try:
        compile(spec, shapes, sizes=sizes, strict=False)
    except SpecError as exc:
        return exc.key == "params"
    return False


def _relaxed(spec: Any, reference: nn.Module, sizes: dict[str, int] | None, example_inputs: Any, strict: bool,
             notes: list[str]) -> list[str]:
    """The spaces that are not true symmetries of the model (symo check's measurement)."""
    if isinstance(spec, CompiledSpec):
        notes.append("symmetry not checked (a CompiledSpec was given): run `symo check` on its spec file")
        return []
    try:
        rows = check_spec(spec, _batch_statistics(reference), example_inputs, sizes=sizes, strict=strict)
    except Exception as exc:  # the user's model could not run on guessed inputs: say so, the alignment stands
        notes.append(f"symmetry not checked: the model did not run on the "
                     f"{'guessed' if example_inputs is None else 'given'} example inputs ({type(exc).__name__}: "
                     f"{str(exc)[:200]}); to check it, {INPUTS_HINT}")
        return []
    return [r.space for r in rows if r.status == "relaxed"]


def _batch_statistics(model: nn.Module) -> nn.Module:
    """A model with BatchNorm layers as a train-mode copy: in eval mode they read running statistics,
    buffers a spec cannot move, so inference and the check would drop every channel space; `align`
    moves those buffers with the channels."""
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return model
    return copy.deepcopy(model).train()


def _moved(compiled: CompiledSpec, element: dict[str, torch.Tensor], other: Any, other_t: Mapping[str, torch.Tensor],
           notes: list[str]) -> Any:
    """`other` moved by the element: a deep copy of the module, or a new state dict."""
    names = compiled.param_names
    moved = compiled.act(element, {n: other_t[n] for n in names})
    state = other.state_dict() if isinstance(other, nn.Module) else other
    buffers = _moved_buffers(compiled, element, state, notes)
    if isinstance(other, nn.Module):
        model = copy.deepcopy(other)
        params = dict(model.named_parameters())
        current = dict(model.named_buffers())
        with torch.no_grad():
            for n in names:
                params[n].copy_(moved[n])
            for n, t in buffers.items():
                current[n].copy_(t)
        return model
    out = dict(other)
    out.update({n: moved[n] for n in names})
    out.update(buffers)
    for alias, source in _aliases(other, names).items():  # tied weights saved under two names
        out[alias] = moved[source]
    return out


def _moved_buffers(compiled: CompiledSpec, element: dict[str, torch.Tensor], state: Mapping[str, torch.Tensor],
                   notes: list[str]) -> dict[str, torch.Tensor]:
    """BatchNorm running statistics that follow their layer's covered weight."""
    out = {}
    for name in compiled.param_names:
        prefix = name[: -len("weight")] if name.endswith("weight") else None
        if prefix is None or f"{prefix}running_mean" not in state:
            continue
        groups = {compiled.spaces[sp]["group"] for b in compiled.param_blocks(name) for axis in b["axes"]
                  for sp, _ in axis if sp is not None}
        mean = state[f"{prefix}running_mean"]
        out[f"{prefix}running_mean"] = compiled.act(element, {name: mean}, [name])[name]
        if f"{prefix}running_var" in state:
            if "orthogonal" in groups:
                notes.append(f"{prefix}running_var cannot follow a rotation; reset the BatchNorm statistics "
                             "(symo.repair) before using the aligned model in eval mode")
                continue
            absolute = {s: q.abs() for s, q in element.items()}
            out[f"{prefix}running_var"] = compiled.act(absolute, {name: state[f"{prefix}running_var"]}, [name])[name]
    return out


def _aliases(state: Mapping[str, torch.Tensor], names: list[str]) -> dict[str, str]:
    """Uncovered entries that share storage with a covered one (tied weights in a state dict)."""
    covered = {(state[n].data_ptr(), tuple(state[n].shape)): n for n in names}
    return {k: covered[(v.data_ptr(), tuple(v.shape))] for k, v in state.items()
            if k not in names and (v.data_ptr(), tuple(v.shape)) in covered}
