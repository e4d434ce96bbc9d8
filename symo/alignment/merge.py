"""Merging two aligned models: `interpolate`, `repair` (BatchNorm reset and REPAIR), and `barrier`.

- `interpolate(a, b, alpha)`: (1 - alpha) a + alpha b, entry by entry, for modules or state dicts.
- `repair(model, data)`: recompute BatchNorm running statistics on `data` ("reset"); with
  `parents=(a, b)` also REPAIR's rescaling (Jordan et al., ICLR 2023): each hidden unit of the
  interpolated model gets the mean and standard deviation interpolated from the parents' same unit,
  folded into the layer's weight and bias.
- `barrier(a, b, loss_fn, data, alphas)`: the loss along the straight path between two models; the
  barrier is the largest rise of the loss above the straight line between the end points' losses
  (Frankle et al. 2020; Entezari et al. 2022; Ainsworth et al. 2023).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .activations import model_inputs
from .result import AlignError

_BATCHNORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_CORRECTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def interpolate(a: nn.Module | Mapping[str, torch.Tensor], b: nn.Module | Mapping[str, torch.Tensor],
                alpha: float) -> nn.Module | dict[str, torch.Tensor]:
    """(1 - alpha) a + alpha b for every floating entry of the state (integer buffers such as BatchNorm's
    batch count come from `a`); a module gives a new module (a copy of `a`), a state dict a state dict."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise AlignError(f"alpha must be a finite number (0 gives a, 1 gives b), got {alpha!r}")
    sa, sb = _state(a, "a"), _state(b, "b")
    only = {label: [k for k in x if k not in y] for label, x, y in (("a", sa, sb), ("b", sb, sa))}
    if any(only.values()):
        which = "; ".join(f"only {label} has {', '.join(map(repr, names[:3]))}"
                          + (f" and {len(names) - 3} more" if len(names) > 3 else "") for label, names in only.items()
                          if names)
        raise AlignError(f"a and b are different models ({which}); interpolate two models of the same architecture")
    out = {}
    for k, va in sa.items():
        vb = sb[k]
        if va.shape != vb.shape:
            raise AlignError(f"a and b have different shapes: {k!r} is {tuple(va.shape)} in a and {tuple(vb.shape)} "
                             "in b; interpolate two models of the same architecture and width")
        out[k] = torch.lerp(va, vb.to(va.dtype), float(alpha)) if va.is_floating_point() else va.clone()
    if isinstance(a, nn.Module):
        model = copy.deepcopy(a)
        model.load_state_dict(out)
        return model
    return out


def _state(x: Any, label: str) -> dict[str, torch.Tensor]:
    if isinstance(x, nn.Module):
        return {k: v.detach() for k, v in x.state_dict().items()}
    if isinstance(x, Mapping) and x and all(isinstance(v, torch.Tensor) for v in x.values()):
        return dict(x)
    raise AlignError(f"{label} is not a model: expected an nn.Module or a state dict {{name: tensor}}, got "
                     f"{type(x).__name__}")


def repair(model: nn.Module, data: Iterable[Any], *, parents: tuple[nn.Module, nn.Module] | None = None,
           alpha: float = 0.5) -> nn.Module:
    """A repaired copy of the interpolated `model` (the input is left as it is).

    Without `parents`: every BatchNorm layer's running statistics are recomputed on `data` (an iterable
    of batches: a tensor, a dict of keyword inputs, or (inputs, targets, ...)). With `parents=(a, b)`,
    the models `model` was interpolated from at `alpha` (b aligned to a), REPAIR: each hidden unit's mean
    and standard deviation over `data` are set to (1 - alpha) times a's plus alpha times b's. The units
    are the outputs of the BatchNorm layers if the model has any, else of every Linear / convolution but
    the last (the output layer); each correction is folded into the layer's weight and bias, in forward
    order, each measured with the ones before it in place."""
    if not isinstance(model, nn.Module):
        raise AlignError(f"repair needs an nn.Module, got {type(model).__name__}")
    batches = list(data)
    if not batches:
        raise AlignError("repair: data holds no batch; give the batches to measure the statistics on")
    out = copy.deepcopy(model)
    if any(isinstance(m, _BATCHNORM) for m in out.modules()):
        _reset_batchnorm(out, batches)
    if parents is None:
        return out
    a, b = parents
    layers = _corrected_layers(out, batches[0])
    targets = {}
    for name in layers:
        ma, sa = _unit_stats(a, name, batches)
        mb, sb = _unit_stats(b, name, batches)
        targets[name] = ((1 - alpha) * ma + alpha * mb, (1 - alpha) * sa + alpha * sb)
    modules = dict(out.named_modules())
    for name in layers:  # forward order: each layer measured with the earlier corrections in place
        mean, std = _unit_stats(out, name, batches)
        goal_mean, goal_std = targets[name]
        _fold(modules[name], mean, std, goal_mean, goal_std)
    return out


def _reset_batchnorm(model: nn.Module, batches: list[Any]) -> None:
    """Recompute running statistics as the plain average over `batches` (momentum None), in train mode."""
    saved = {}
    for m in model.modules():
        if isinstance(m, _BATCHNORM):
            saved[m] = m.momentum
            m.reset_running_stats()
            m.momentum = None
    try:
        _run(model, batches, train=True)
    finally:
        for m, momentum in saved.items():
            m.momentum = momentum


def _corrected_layers(model: nn.Module, batch: Any) -> list[str]:
    """The layers REPAIR corrects, in the order the forward pass runs them: the BatchNorm layers, else every
    Linear / convolution but the last one run."""
    order: list[str] = []
    kinds = _BATCHNORM if any(isinstance(m, _BATCHNORM) for m in model.modules()) else _CORRECTED
    handles = [m.register_forward_hook(lambda mod, args, out, n=name: order.append(n))
               for name, m in model.named_modules() if isinstance(m, kinds)]
    try:
        _run(model, [batch])
    finally:
        for h in handles:
            h.remove()
    order = list(dict.fromkeys(order))
    return order if kinds is _BATCHNORM else order[:-1]


def _unit_stats(model: nn.Module, name: str, batches: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of each output unit (channel) of module `name` over `batches`, eval mode."""
    module = dict(model.named_modules())[name]
    sums: list[torch.Tensor] = []

    def record(_m, _args, out):
        dim = 1 if out.dim() > 2 and not isinstance(_m, nn.Linear) else out.dim() - 1
        x = out.detach().double().movedim(dim, -1).reshape(-1, out.shape[dim])
        part = torch.stack([x.sum(0), (x * x).sum(0), torch.full_like(x[0], x.shape[0])])
        sums.append(part if not sums else sums.pop() + part)

    handle = module.register_forward_hook(record)
    try:
        _run(model, batches)
    finally:
        handle.remove()
    s, s2, n = sums[0]
    mean = s / n
    return mean, (s2 / n - mean * mean).clamp_min(0).sqrt()


def _run(model: nn.Module, batches: list[Any], train: bool = False) -> None:
    """Forward passes without gradients, in eval mode (or train mode); every module's mode restored after."""
    modes = {m: m.training for m in model.modules()}
    try:
        model.train(train)
        with torch.no_grad():
            for batch in batches:
                args, kwargs = model_inputs(batch)
                model(*args, **kwargs)
    finally:
        for m, mode in modes.items():
            m.training = mode


def _fold(module: nn.Module, mean: torch.Tensor, std: torch.Tensor, goal_mean: torch.Tensor,
          goal_std: torch.Tensor) -> None:
    """y -> (y - mean) * goal_std / std + goal_mean, folded into the module's weight and bias."""
    scale = goal_std / (std + 1e-12)
    shift = goal_mean - mean * scale
    weight, bias = module.weight, getattr(module, "bias", None)
    if weight is None or bias is None:
        raise AlignError(f"repair: {type(module).__name__} has no weight or bias to fold the correction into; "
                         "REPAIR needs layers with a bias (or BatchNorm layers)")
    with torch.no_grad():
        shape = (-1,) + (1,) * (weight.dim() - 1)
        weight.mul_(scale.to(weight.dtype).reshape(shape))
        bias.mul_(scale.to(bias.dtype)).add_(shift.to(bias.dtype))


@dataclass
class BarrierResult:
    """The path's values: `alphas`, and `values[name]` per alpha (the loss, and whatever else `loss_fn`
    returned). `barrier(name)`: the largest rise above the straight line between the end points (a drop
    below it for names in `higher_is_better`, e.g. accuracy); `midpoint(name)`: the value at alpha 0.5."""

    alphas: list[float]
    values: dict[str, list[float]]
    higher_is_better: frozenset[str] = field(default_factory=lambda: frozenset({"acc", "accuracy"}))

    def _values(self, name: str) -> list[float]:
        if name not in self.values:
            raise KeyError(f"no values named {name!r} on this path; loss_fn returned {sorted(self.values)}")
        return self.values[name]

    def barrier(self, name: str = "loss") -> float:
        v, al = self._values(name), self.alphas
        i0, i1 = al.index(min(al)), al.index(max(al))
        line = [v[i0] + (a - al[i0]) / (al[i1] - al[i0]) * (v[i1] - v[i0]) for a in al]
        sign = -1.0 if name in self.higher_is_better else 1.0
        return max(sign * (x - y) for x, y in zip(v, line))

    def midpoint(self, name: str = "loss") -> float:
        k = min(range(len(self.alphas)), key=lambda i: abs(self.alphas[i] - 0.5))
        return self._values(name)[k]

    def plot(self, path: str | Path, name: str = "loss", label: str | None = None) -> Path | None:
        """The curve against alpha as a PNG (None when matplotlib is not installed)."""
        return plot_paths({label or name: self}, path, name)


def barrier(a: nn.Module, b: nn.Module, loss_fn: Callable[[nn.Module, Any], Any], data: Iterable[Any],
            alphas: int | Sequence[float] = 11, *, repair_data: Iterable[Any] | None = None,
            repair_mode: str | None = None, plot: str | Path | None = None) -> BarrierResult:
    """The loss along (1 - alpha) a + alpha b.

    `loss_fn(model, batch)` returns the batch's loss (a number or a 0-d tensor), or a dict of such values
    (e.g. {"loss": ..., "acc": ...}); each is averaged over the batches of `data`, weighted by the batch's
    size (its first input's first dimension). `alphas`: a count of evenly spaced points in [0, 1] or the
    values. `repair_mode`: None, "reset" (BatchNorm statistics recomputed on `repair_data` at every alpha)
    or "repair" (REPAIR with a and b as parents). `plot`: also write the curve there."""
    if isinstance(alphas, int):
        if alphas < 2:
            raise AlignError(f"alphas: give at least 2 points, got {alphas}")
        alphas = [i / (alphas - 1) for i in range(alphas)]
    alphas = [float(x) for x in alphas]
    if repair_mode not in (None, "reset", "repair"):
        raise AlignError(f"repair_mode must be None, 'reset' or 'repair', got {repair_mode!r}")
    if repair_mode is not None and repair_data is None:
        raise AlignError(f"repair_mode={repair_mode!r} needs repair_data (batches to measure the statistics on)")
    batches = list(data)
    fix = list(repair_data) if repair_data is not None else None
    values: dict[str, list[float]] = {}
    for alpha in alphas:
        model = interpolate(a, b, alpha)
        if repair_mode == "reset":
            model = repair(model, fix)
        elif repair_mode == "repair":
            model = repair(model, fix, parents=(a, b), alpha=alpha)
        for k, v in evaluate(model, loss_fn, batches).items():
            values.setdefault(k, []).append(v)
    result = BarrierResult(alphas, values)
    if plot is not None:
        result.plot(plot)
    return result


def evaluate(model: nn.Module, loss_fn: Callable[[nn.Module, Any], Any], batches: Iterable[Any]) -> dict[str, float]:
    """Batch-size-weighted means of what `loss_fn(model, batch)` returns, in eval mode without gradients."""
    totals: dict[str, float] = {}
    weight = 0.0
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            for batch in batches:
                out = loss_fn(model, batch)
                out = out if isinstance(out, Mapping) else {"loss": out}
                args, kwargs = model_inputs(batch)
                first = args[0] if args else next(iter(kwargs.values()))
                n = float(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1.0
                for k, v in out.items():
                    totals[k] = totals.get(k, 0.0) + n * float(v)
                weight += n
    finally:
        for m, mode in modes.items():
            m.training = mode
    if not weight:
        raise AlignError("data holds no batch; give the batches to evaluate the loss on")
    return {k: v / weight for k, v in totals.items()}


def plot_paths(curves: Mapping[str, BarrierResult], path: str | Path, name: str = "loss",
               title: str | None = None) -> Path | None:
    """Several paths' `name` against alpha in one PNG; None when matplotlib is not installed."""
    try:
        import matplotlib  # optional (the `bench` extra): the plot is skipped without it

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # (the same optional dependency)
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, res in curves.items():
        ax.plot(res.alphas, res.values[name], marker="o", ms=3, label=label)
    ax.set_xlabel("alpha (0: a, 1: b)")
    ax.set_ylabel(name)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
