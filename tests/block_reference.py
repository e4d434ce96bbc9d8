"""A first-principles reference for the Symo optimizer (docs/theory.md §3-4), sharing no code with ``symo``.

Blocks are built by hand from the irreducible pieces of each space (docs/theory.md §3), and every matrix
function is a dense float64 eigendecomposition; the optimizer is a plain loop over steps that follows
the README's description of each option. Small layouts only.

Layout: ``spaces = {name: kind}`` with kind "signed_perm", "orthogonal" (one natural piece, dim n) or
"perm" (trivial piece 1^T x / sqrt(n), dim 1; standard piece (I - J/n) x, n coordinates, dim n - 1);
``axes = {param: (axis, ...)}`` with each axis a space name or "_" (free).
"""

from __future__ import annotations

import itertools
import math

import torch
from helpers import ref_power

F64 = torch.float64


def _pieces(kind: str, n: int) -> list[tuple[str, torch.Tensor, int, bool]]:
    """(piece name, coordinate map k x n, irrep dimension, trivial?) for one space."""
    if kind in ("signed_perm", "orthogonal"):
        return [("nat", torch.eye(n, dtype=F64), n, False)]
    if kind == "perm":
        ones = torch.ones(1, n, dtype=F64) / math.sqrt(n)
        return [("triv", ones, 1, True), ("std", torch.eye(n, dtype=F64) - 1.0 / n, n - 1, False)]
    raise ValueError(kind)


class BlockLayout:
    """Isotypic blocks Y_lambda (mult x width) and their transposes, built from each space's irreducible pieces."""

    def __init__(self, spaces: dict[str, str], axes: dict[str, tuple[str, ...]], shapes: dict[str, tuple]):
        self.axes, self.shapes = axes, shapes
        sizes = {}
        for name, ax in axes.items():
            for a, n in zip(ax, shapes[name]):
                if a != "_":
                    assert sizes.setdefault(a, n) == n, (a, n)
        # components: one per choice of piece on each group axis of a parameter
        self.components: dict[tuple, list[tuple[str, list]]] = {}
        self.dims: dict[tuple, int] = {}
        for name, ax in axes.items():
            choices = [_pieces(spaces[a], sizes[a]) if a != "_" else [None] for a in ax]
            for pick in itertools.product(*choices):
                label = tuple(sorted((a, p[0]) for a, p in zip(ax, pick) if p is not None and not p[3]))
                self.components.setdefault(label, []).append((name, list(pick)))
                self.dims[label] = math.prod(p[2] for p in pick if p is not None and not p[3])

    def _component_matrix(self, t: torch.Tensor, pick: list, ax: tuple) -> torch.Tensor:
        c = t.to(F64)
        for i, p in enumerate(pick):
            if p is not None:
                c = torch.movedim(torch.tensordot(p[1], c, dims=([1], [i])), 0, i)
        # rows: free and trivial axes; columns: non-trivial axes ordered by space name
        cols = sorted((a, i) for i, (a, p) in enumerate(zip(ax, pick)) if p is not None and not p[3])
        col_axes = [i for _, i in cols]
        row_axes = [i for i in range(c.ndim) if i not in col_axes]
        c = c.permute(*row_axes, *col_axes)
        width = math.prod(c.shape[len(row_axes):])
        return c.reshape(-1, width)

    def coords(self, tensors: dict[str, torch.Tensor]) -> dict[tuple, torch.Tensor]:
        return {label: torch.cat([self._component_matrix(tensors[n], pick, self.axes[n]) for n, pick in comps])
                for label, comps in self.components.items()}

    def scatter(self, ys: dict[tuple, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {n: torch.zeros(s, dtype=F64) for n, s in self.shapes.items()}
        for label, comps in self.components.items():
            row = 0
            for n, pick in comps:
                ax = self.axes[n]
                # the component's coordinate shape, then undo the permutation and the maps
                cshape = [p[1].shape[0] if p is not None else s for p, s in zip(pick, self.shapes[n])]
                cols = sorted((a, i) for i, (a, p) in enumerate(zip(ax, pick)) if p is not None and not p[3])
                col_axes = [i for _, i in cols]
                row_axes = [i for i in range(len(ax)) if i not in col_axes]
                perm = row_axes + col_axes
                rows = math.prod(cshape[i] for i in row_axes)
                c = ys[label][row:row + rows].reshape([cshape[i] for i in perm])
                row += rows
                c = c.permute(*[perm.index(i) for i in range(len(ax))])
                for i, p in enumerate(pick):
                    if p is not None:
                        c = torch.movedim(torch.tensordot(p[1].T, c, dims=([1], [i])), 0, i)
                out[n] += c
        return out

    def invariant_part(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """R1: keep only the all-trivial label (the invariant vectors)."""
        ys = self.coords(tensors)
        return self.scatter({k: (y if k == () else torch.zeros_like(y)) for k, y in ys.items()})


def geometric_mean_inverse(sw: torch.Tensor, sg: torch.Tensor) -> torch.Tensor:
    """H = S_w^{-1} # S_g = S_w^{-1/2} (S_w^{1/2} S_g S_w^{1/2})^{1/2} S_w^{-1/2} (S_w positive definite)."""
    half, ihalf = ref_power(sw, 0.5), ref_power(sw, -0.5)
    return ihalf @ ref_power(half @ sg @ half, 0.5) @ ihalf


class ReferenceSymo:
    """The Symo update written as a loop over steps, option by option (README "The Symo optimizer").

    Per step t (from 1), for gradients g and weights w (before the step):
      m = beta1 m + (1 - beta1) g;  u = (1 - beta1) g + beta1 m (nesterov) or m
      per block: Y = coords(u), Ys = coords(u or g); stat = Ys Ys^T / d
        A_t = stat (beta2 = 0) | sum of stats (beta2 = 1) | EMA / (1 - beta2^t)
        every k-th step (t - 1 = 0 mod k): P = A_t^power (gradient estimator), or with
          H = (S_w + delta I)^{-1} # A_t (taylor; S_w of the centred w; invariant block: gradient) P = H^{2 power}
        z = scale * P Y
      d = scatter(z); muon scale (parameter_rms): each parameter's d rescaled to RMS 1/sqrt(numel / rows)
      w = (1 - lr wd) w - lr d
    """

    def __init__(self, layout: BlockLayout, lr: float, beta1: float = 0.95, nesterov: bool = True,
                 beta2: float = 0.0, source: str = "momentum", damping: float = 1e-6,
                 damping_mode: str = "relative", estimator: str = "gradient", power: float = -0.5,
                 precondition_frequency: int = 1, weight_decay: float = 0.0, update_scale: str = "natural",
                 adamw_rms: float = 0.2, parameter_rms: bool = True, global_lambda_max: bool = False,
                 centre_weights: bool = True):
        self.layout, self.lr = layout, lr
        self.o = dict(beta1=beta1, nesterov=nesterov, beta2=beta2, source=source, damping=damping,
                      mode=damping_mode, estimator=estimator, power=power, k=precondition_frequency,
                      wd=weight_decay, scale=update_scale, rms=adamw_rms, parameter_rms=parameter_rms)
        # deliberately wrong variants, so a test can show how far a broken option would land
        self.global_lambda_max = global_lambda_max    # relative damping against the largest block's lambda_max
        self.centre_weights = centre_weights          # taylor with S_w = R2(w) instead of R2(w - R1(w))
        self.t = 0
        self.m: dict[str, torch.Tensor] | None = None
        self.ema: dict[tuple, torch.Tensor] = {}
        self.precond: dict[tuple, torch.Tensor] = {}

    def _power(self, a: torch.Tensor, p: float, lam_global: float) -> torch.Tensor:
        o = self.o
        if self.global_lambda_max and o["mode"] == "relative":
            lam = float(torch.linalg.eigvalsh(a).max())
            return ref_power(a, p, o["damping"] * lam_global / max(lam, 1e-300))
        return ref_power(a, p, o["damping"], o["mode"] == "absolute")

    def step(self, w: dict[str, torch.Tensor], g: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        o, lay = self.o, self.layout
        self.t += 1
        t = self.t
        g = {n: x.to(F64) for n, x in g.items()}
        if self.m is None:
            self.m = {n: torch.zeros_like(x) for n, x in g.items()}
        for n in g:
            self.m[n] = o["beta1"] * self.m[n] + (1 - o["beta1"]) * g[n]
        u = {n: ((1 - o["beta1"]) * g[n] + o["beta1"] * self.m[n]) if o["nesterov"] else self.m[n] for n in g}
        ys = lay.coords(u)
        ss = lay.coords(u if o["source"] == "momentum" else g)
        a = {}
        for label, y in ss.items():
            stat = y @ y.T / lay.dims[label]
            if o["beta2"] == 0.0:
                a[label] = stat
            elif o["beta2"] == 1.0:
                self.ema[label] = self.ema.get(label, 0) + stat
                a[label] = self.ema[label]
            else:
                self.ema[label] = o["beta2"] * self.ema.get(label, 0) + (1 - o["beta2"]) * stat
                a[label] = self.ema[label] / (1 - o["beta2"] ** t)
        if (t - 1) % o["k"] == 0:
            lam_global = max(float(torch.linalg.eigvalsh(x).max()) for x in a.values())
            sw = None
            if o["estimator"] == "taylor":
                inv = lay.invariant_part(w) if self.centre_weights else {n: 0.0 for n in w}
                sw = lay.coords({n: w[n].to(F64) - inv[n] for n in w})
            for label, x in a.items():
                if sw is None or (label == () and self.centre_weights):  # centred S_w = 0 there: S_g
                    self.precond[label] = self._power(x, o["power"], lam_global)
                    continue
                s = sw[label] @ sw[label].T / lay.dims[label]
                lam_w = float(torch.linalg.eigvalsh(s).max())
                delta = max(o["damping"], 1e-8) * (lam_w if o["mode"] == "relative" else 1.0)
                h = geometric_mean_inverse(s + delta * torch.eye(len(s), dtype=F64), x)
                # H is a square root of S_g-like data: its rounding zeros sit near sqrt(m eps) lambda_max
                zero = math.sqrt(len(h) * torch.finfo(F64).eps)
                self.precond[label] = ref_power(h, 2 * o["power"], o["damping"], o["mode"] == "absolute",
                                                zero_rel=zero)
        zs = {}
        for label, y in ys.items():
            d = lay.dims[label]
            z = self.precond[label] @ y
            if o["scale"] in ("muon", "adamw"):
                z = z * d ** o["power"]
            if o["scale"] == "muon":
                z = z * math.sqrt(max(1.0, y.shape[1] / y.shape[0]))
            if o["scale"] == "adamw":
                z = z * (o["rms"] / (z.norm() / math.sqrt(y.shape[0] * d)))
            zs[label] = z
        upd = lay.scatter(zs)
        if o["scale"] == "muon" and o["parameter_rms"]:
            # a parameter that is not a Muon matrix (its rows moved by a space of its own, its other axes free; or
            # a vector alone in the invariant block) at the RMS Muon gives a full-rank matrix of its shape,
            # 1/sqrt(numel / rows) (a 1-D parameter: one row)
            used = [a for ax in lay.axes.values() for a in ax if a != "_"]
            invariant = {name for name, _ in lay.components.get((), [])}
            for n, x in upd.items():
                ax = lay.axes[n]
                if len(ax) > 1 and ax[0] != "_" and used.count(ax[0]) == 1 and all(a == "_" for a in ax[1:]):
                    continue
                if ax == ("_",) and invariant == {n}:
                    continue
                fan_in = x.numel() / (x.shape[0] if x.dim() > 1 else 1)
                upd[n] = x / x.pow(2).mean().sqrt() / math.sqrt(fan_in)
        return {n: (1 - self.lr * o["wd"]) * w[n].to(F64) - self.lr * upd[n] for n in w}
