"""Infer a model's weight-space symmetry spec from the nn.Module, and verify which symmetries are true.

    spec = symo.infer_spec(model, example_inputs)        # a Spec; spec.to_toml() is a file to commit
    result = symo.infer.infer(model, example_inputs)     # + the verification report
    print(result.report())

Pipeline: trace one forward pass (trace.py, with the operation table of handlers.py) -> axis graph
(axes.py) -> layout: spaces, groups, per-head owners (layout.py) -> numeric verification in float64,
narrowing or dropping what fails (verify.py) -> names and {i} patterns (names.py). docs/infer.md explains it.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..compiler import BoundSpec, Spec, SpecError, bind, load_spec, shapes_of
from ..runtime.text import fit_lines, summarize_names
from .handlers import new_tracer
from .layout import Dropped, Layout, build_layout
from .names import _join, build_spec, name_spaces
from .relax import RELAXATIONS, muon_layout
from .trace import TraceResult, _tensors
from .uses import usage_line
from .verify import OutputCheck

NARROWER = {"orthogonal": "signed_perm", "signed_perm": "perm", "perm": None}


@dataclass
class SpaceResult:
    """One inferred space: the group kept, what the check measured, and why."""

    name: str
    group: str
    inferred: str  # the group the graph allowed, before the numeric check
    size: int
    per: str | None
    status: str  # "true", "narrowed", "identity", "relaxed" (by request), "unchecked"
    rel_change: float | None
    why: str
    params: list[str]


@dataclass
class Inference:
    spec: Spec
    spaces: list[SpaceResult]
    dropped: list[Dropped]
    unknown_ops: list[tuple[str, list[str]]]
    uncovered: dict[str, tuple[int, ...]]
    notes: list[str]
    seconds: dict[str, float]
    covered_params: int
    total_params: int
    joint_rel_change: float | None = None
    tolerance: float = 1e-9
    forwards: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def true_spaces(self) -> int:
        return sum(1 for s in self.spaces if s.status in ("true", "narrowed"))

    def report(self) -> str:
        share = 100 * self.covered_params / max(self.total_params, 1)
        lines = [f"inferred spec {self.spec.name!r}: {len(self.spaces)} spaces, {self.covered_params:,} of "
                 f"{self.total_params:,} parameters covered ({share:.1f}%)",
                 fit_lines([usage_line(self.extra.get("relax"))])]
        width = max([len(s.name) for s in self.spaces] + [5])
        group_width = max([len(s.group) + (len(f" per {s.per}") if s.per else 0) for s in self.spaces] + [28])
        for s in self.spaces:
            per = f" per {s.per}" if s.per else ""
            jointly = self.extra.get("checked_jointly")
            change = "" if s.rel_change is None or jointly else f"  rel. change {s.rel_change:.1e}"
            narrowed = f" (graph allowed {s.inferred})" if s.status == "narrowed" else ""
            lines.append(f"  {s.name:<{width}} {s.group + per:<{group_width}} n={s.size:<6} {s.status}{narrowed}"
                         f"{change}  [{s.why}]")
        if self.joint_rel_change is not None:
            verdict = "true" if self.joint_rel_change <= self.tolerance else "NOT true"
            lines.append(f"all spaces at once: rel. change {self.joint_rel_change:.1e} ({verdict}; tolerance "
                         f"{self.tolerance:.0e}, float64, {self.forwards} forward passes)"
                         + (": every space above is checked by this" if self.extra.get("checked_jointly") else ""))
        for d in self.dropped:  # a would-be space, not the parameters: they keep the spaces of their other axes
            kept = [p for p in d.params if p not in self.uncovered]
            lost = [p for p in d.params if p in self.uncovered]
            lines.append(f"dropped a would-be space ({d.reason}); its axes are left free in: {_short(d.params)}"
                         + (f" (still covered on other axes: {_short(kept)})" if kept else "")
                         + (f" (uncovered as a result: {_short(lost)})" if lost else ""))
        for op, params in self.unknown_ops:
            lines.append(f"unsupported operation {op!r}: axes it touches are left free; parameters: {_short(params)}")
        if self.uncovered:
            lines.append("uncovered: " + summarize_names(self.uncovered))
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append("time: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items()))
        return "\n".join(lines)


def _short(names: list[str]) -> str:
    return summarize_names(names) if names else "(none)"


def default_example_inputs(model: nn.Module) -> tuple[tuple, dict]:
    """Inputs for a model that did not come with any: `model.example_inputs()` if it has one, token ids
    for a model with an embedding (Hugging Face models get `use_cache=False`), else a random batch for
    the first Linear / convolution, in that layer's floating dtype (a float64 model gets float64 inputs)."""
    gen = torch.Generator().manual_seed(0)
    maker = getattr(model, "example_inputs", None)
    if callable(maker):
        return normalize_inputs(maker())
    sig = inspect.signature(model.forward)
    required = [p for p in sig.parameters.values() if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    cfg = getattr(model, "config", None)
    if cfg is not None and getattr(cfg, "vocab_size", None) and "input_ids" in sig.parameters:
        kwargs = {"input_ids": torch.randint(0, cfg.vocab_size, (1, 8), generator=gen)}
        if "use_cache" in sig.parameters:
            kwargs["use_cache"] = False
        return (), kwargs
    if not required:
        return (), {}
    if embeddings:
        t = min(8, min(e.num_embeddings for e in embeddings))
        return (torch.randint(0, embeddings[0].num_embeddings, (1, t), generator=gen),), {}
    for m in model.modules():
        dtype = m.weight.dtype if isinstance(getattr(m, "weight", None), torch.Tensor) else None
        dtype = dtype if dtype is not None and dtype.is_floating_point else torch.float32
        if isinstance(m, nn.Linear):
            return (torch.randn(2, m.in_features, generator=gen, dtype=dtype),), {}
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            k = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3}[type(m)]
            return (torch.randn(2, m.in_channels, *([32] * k), generator=gen, dtype=dtype),), {}
    raise ValueError(f"cannot guess example inputs for {type(model).__name__}; pass example_inputs=(tensor, ...) "
                     "or give the model an example_inputs() method")


def normalize_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, tuple) and len(example_inputs) == 2 and isinstance(example_inputs[1], Mapping) \
            and isinstance(example_inputs[0], tuple):
        return example_inputs[0], dict(example_inputs[1])
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs), {}
    raise TypeError("example_inputs must be a tensor, a tuple of positional inputs, a dict of keyword inputs, "
                    "or (args, kwargs)")


def trace(model: nn.Module, args: tuple, kwargs: dict) -> TraceResult:
    """One forward pass under the recording mode; buffers (BatchNorm statistics) are restored after."""
    tr = new_tracer()
    for n, p in model.named_parameters():
        tr.add_param(n, p)
    for t in _tensors((args, kwargs)):
        tr.add_data(t)
    saved = {n: b.detach().clone() for n, b in model.named_buffers()}
    try:
        with torch.no_grad(), tr:
            out = model(*args, **kwargs)
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
    for t in _tensors(out):  # outputs are observed: no group may move their axes
        r = tr.rec(t)
        if r is not None:
            for a in r.atoms:
                tr.g.pin(a)
    return TraceResult(tr.g, tr.param_atoms, tr.out_axis, tr.unknown, tr.notes, tr.ops, tr.used)


def infer(model: nn.Module, example_inputs: Any = None, *, heads: int | None = None, relax: str | None = None,
          verify: bool = True, trials: int = 2, tolerance: float = 1e-9, seed: int = 0,
          name: str | None = None, each: bool = False) -> Inference:
    """Infer and verify; see `infer_spec`. Returns the spec with the per-space report.

    `each=True` measures every family of spaces separately even when the joint check passes (slower; the
    report then gives each family's own relative change)."""
    if relax is not None and relax not in RELAXATIONS:
        raise ValueError(f"relax must be None or one of {list(RELAXATIONS)}, got {relax!r}")
    t0 = time.perf_counter()
    args, kwargs = default_example_inputs(model) if example_inputs is None else normalize_inputs(example_inputs)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    tr = trace(model, args, kwargs)
    layout = build_layout(tr, shapes, heads)
    seconds = {"trace": time.perf_counter() - t0}
    relaxed = {None: "", "muon": ", Muon relaxation", "muon_pieces": ", Muon relaxation, fused matrices in pieces"}
    title = name or f"{type(model).__name__} (inferred{relaxed[relax]})"
    inferred = {sid: s.group for sid, s in layout.spaces.items()}
    results: dict[int, tuple[str, float | None]] = {}
    check = None
    if relax is not None:
        layout = muon_layout(layout, pieces=relax == "muon_pieces")
        inferred = {sid: s.group for sid, s in layout.spaces.items()}
        results = {sid: ("relaxed", None) for sid in layout.spaces}
    elif verify and layout.spaces:
        t1 = time.perf_counter()
        check = OutputCheck(model, args, kwargs)
        results = _verify(layout, check, trials, tolerance, seed, each)
        seconds["verify"] = time.perf_counter() - t1
    names = name_spaces(layout)
    spec = build_spec(layout, names, title)
    try:
        bound = bind(spec, shapes)
    except SpecError:  # a pattern the compiler reads differently: fall back to one rule per parameter
        spec = build_spec(layout, names, title, template=False)
        bound = bind(spec, shapes)
    joint = None
    jointly = check is not None and not each and bool(results) and all(st == "true" for st, _ in results.values())
    if jointly:
        joint = max(rel for _, rel in results.values())  # the first, joint check covered every space
    elif check is not None and relax is None:
        t1 = time.perf_counter()
        moving = {s: sp.group for s, sp in bound.spaces.items() if sp.group != "identity"}
        joint = check.rel_change(bound, moving, trials=1, generator=torch.Generator().manual_seed(seed + 1)) \
            if moving else 0.0
        seconds["verify"] = seconds.get("verify", 0.0) + time.perf_counter() - t1
    literal = {sid: n for sid, n in _instance_names(names).items()}
    spaces = []
    for sid, s in layout.spaces.items():
        status, rel = results.get(sid, ("unchecked", None))
        if s.group == "identity":
            status = "identity"
        spaces.append(SpaceResult(literal[sid], s.group, inferred.get(sid, s.group), s.size,
                                  literal.get(s.per) if s.per is not None else None, status, rel, s.why, s.params))
    total = sum(math.prod(s) for s in shapes.values())
    covered = sum(math.prod(shapes[n]) for n in layout.axes)
    uncovered = {n: shapes[n] for n in shapes if n not in layout.axes}
    seconds["total"] = time.perf_counter() - t0
    return Inference(spec, spaces, layout.dropped, layout.unknown, uncovered, layout.notes, seconds, covered, total,
                     joint, check.tolerance(tolerance) if check else tolerance, check.forwards if check else 0,
                     {"bound": bound, "checked_jointly": jointly, "relax": relax})


def infer_spec(model: nn.Module, example_inputs: Any = None, *, heads: int | None = None,
               relax: str | None = None) -> Spec:
    """The weight-space symmetry spec of `model`, traced on `example_inputs` and checked numerically.

    - `example_inputs`: a tensor, a tuple of positional inputs, a dict of keyword inputs, or (args, kwargs);
      None guesses them (token ids for a model with an embedding, a random batch otherwise).
    - `heads`: the head count for attention whose head split the graph does not show.
    - `relax="muon"`: the Muon-style relaxation instead (a private signed_perm row space per hidden matrix);
      `relax="muon_pieces"`: the same with each piece of a fused matrix (c_attn's q, k, v) a matrix of its own.

    Every space is verified in float64 with random group elements; one that fails is narrowed
    (orthogonal -> signed_perm -> perm) or dropped. `symo.infer` returns the report as well.
    """
    return infer(model, example_inputs, heads=heads, relax=relax).spec


def training_spec(model: nn.Module, example_inputs: Any = None, *, heads: int | None = None) -> Spec:
    """The spec that trains best in our measurements: the Muon-style relaxation of the inferred spec
    (`infer_spec(model, relax="muon")`, what `symo.Symo(model)` uses). Every hidden weight matrix gets a
    private signed_perm row space; embeddings, the classifier, the first layer and 1-D parameters are left
    uncovered, so the optimizer gives them to AdamW. The true group (`infer_spec(model)`) is the spec for
    the curvature and alignment tools (docs/infer.md, "Which spec for what").

    Guessed inputs (`example_inputs=None`) are made on the device of the model's parameters, so a model
    already moved to a GPU is traced there."""
    if example_inputs is None:
        example_inputs = _on_device_of(model, default_example_inputs(model))
    return infer(model, example_inputs, heads=heads, relax="muon").spec


def _on_device_of(model: nn.Module, inputs: tuple[tuple, dict]) -> tuple[tuple, dict]:
    """(args, kwargs) with every tensor moved to the device of the model's first parameter."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if device.type == "cpu":
        return inputs

    def move(x: Any) -> Any:
        return x.to(device) if isinstance(x, torch.Tensor) else x

    args, kwargs = inputs
    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def _instance_names(names: dict[int, tuple[str, tuple[str, ...]]]) -> dict[int, str]:
    return {sid: _join(b, idx) for sid, (b, idx) in names.items()}


def _verify(layout: Layout, check: OutputCheck, trials: int, tol: float, seed: int,
            each: bool = False) -> dict[int, tuple[str, float]]:
    """All spaces at once first (one random element of the whole group per trial): if the outputs stay
    put, every space is true. Otherwise (or with `each`) each family (all layers' MLP spaces together),
    then each space of a failing family alone, narrowing its group until it holds or dropping it."""
    gen = torch.Generator().manual_seed(seed)
    tol = check.tolerance(tol)
    if check.note():
        layout.notes.append(check.note())
    fam = name_spaces(layout)
    names = _instance_names(fam)
    bound: BoundSpec = bind(build_spec(layout, fam, "verification", template=False), layout.shapes)
    moving = [sid for sid, s in layout.spaces.items() if s.group != "identity"]
    if not each:
        rel = check.rel_change(bound, {names[sid]: layout.spaces[sid].group for sid in moving}, trials=trials,
                               generator=gen)
        if rel <= tol:
            return {sid: ("true", rel) for sid in moving}
    units: dict[str, list[int]] = {}
    for sid in moving:
        units.setdefault(fam[sid][0], []).append(sid)
    results: dict[int, tuple[str, float]] = {}
    for unit in units.values():
        groups = {names[sid]: layout.spaces[sid].group for sid in unit}
        rel = check.rel_change(bound, groups, trials=trials, generator=gen)
        if rel <= tol:
            results.update({sid: ("true", rel) for sid in unit})
            continue
        owners = {s.per for s in layout.spaces.values() if s.per is not None}
        for sid in unit:
            group = first = layout.spaces[sid].group
            if sid in owners:  # heads permuted as wholes, or kept in their slots (their per-head groups stay)
                rel = check.rel_change(bound, {names[sid]: group}, trials=trials, generator=gen)
                results[sid] = ("true", rel)
                if rel > tol:
                    results[sid] = ("narrowed", rel)
                    layout.spaces[sid].group = "identity"
                    layout.spaces[sid].why += (f"; heads stay in place: permuting them changes the output by {rel:.1e} "
                                               "(the numeric check; an operation the graph analysis missed ties "
                                               "each head to its slot)")
                continue
            while group is not None:
                rel = check.rel_change(bound, {names[sid]: group}, trials=trials, generator=gen)
                if rel <= tol:
                    break
                group = NARROWER[group]
            if group is None:
                results[sid] = ("dropped", rel)
                layout.drop(sid, f"{names[sid]}: the output moves under every group (perm: relative change "
                            f"{rel:.1e}); an operation the graph analysis missed breaks it")
                continue
            if group != first:
                layout.spaces[sid].why += f"; narrowed from {first} by the numeric check"
                layout.spaces[sid].group = group
            results[sid] = ("true" if group == first else "narrowed", rel)
    return results


@dataclass
class SpaceCheck:
    """`symo check`: one declared space, whether the model's outputs see it."""

    space: str
    group: str
    per: str | None
    size: int
    rel_change: float | None  # None for identity spaces (no action)
    tolerance: float

    @property
    def status(self) -> str:
        if self.rel_change is None:
            return "identity"
        return "true" if self.rel_change <= self.tolerance else "relaxed"


def check_spec(spec: Spec | str, model: nn.Module, example_inputs: Any = None, *, sizes: dict[str, int] | None = None,
               trials: int = 2, tolerance: float = 1e-9, seed: int = 0, strict: bool = True) -> list[SpaceCheck]:
    """For each declared space (hand-written or inferred), the relative change of the model's float64
    outputs under random elements of its group alone: "true" at rounding level, else "relaxed".
    `strict=False`: rules matching none of the model's parameters are dropped (as in `symo.compile`)."""
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    bound = bind(spec, shapes_of(model), sizes, strict=strict)
    args, kwargs = default_example_inputs(model) if example_inputs is None else normalize_inputs(example_inputs)
    check = OutputCheck(model, args, kwargs)
    tolerance = check.tolerance(tolerance)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name, sp in bound.spaces.items():
        rel = None if sp.group == "identity" else check.rel_change(bound, {name: sp.group}, trials=trials,
                                                                    generator=gen)
        out.append(SpaceCheck(name, sp.group, sp.per, sp.size, rel, tolerance))
    return out
