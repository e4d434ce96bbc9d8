"""A run that diverges, told while it happens: `DivergenceWatch` follows the norm of the weights a kind updates
and warns once (`DivergenceWarning`) when it grows `GROWTH` times within `WINDOW` steps.

Why the weights' norm: a kind sees neither the loss nor the learning rate, but it sees the weights (block
coordinates) at every step. A step whose update scales with the weights themselves (the published step's
H_inv m is about as large as w, whatever the gradients' scale) multiplies their norm by up to (1 + lr c) per
step: a rate that trains keeps that factor near 1 (a 10-step growth of 1.1x to 1.8x on the test's MLP at the
rates that train), while a rate that blows up grows it geometrically, 10x within a few steps, while the loss
climbs from O(1) to 1e2 and then overflows. A warning, not an error: a growing norm is strong evidence, not
proof (a model started from very small weights grows them legitimately), and the non-finite values that
follow are raised already (`NonFiniteGradientError`).

The rate in the message is read back from the weights: the optimizer applies w <- (1 - lr wd) w - lr z with
z the kind's output, so the change of a few sampled block coordinates between two steps, fitted against the
previous step's z and w, gives lr (and lr wd). That takes `SKETCH` numbers per block, not a copy of the weights;
when the fit does not hold (param groups with different rates, weights changed outside the optimizer) the
message names the rate without a value.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections import deque
from pathlib import Path

import torch

GROWTH = 10.0
"""The weights' norm grown this many times ..."""
WINDOW = 10
"""... within this many steps: a diverging run."""
SKETCH = 16
"""Block coordinates per block kept from one step to the next, to read the learning rate back."""
FIT_TOLERANCE = 1e-3
"""The largest relative residual of that fit for its rate to be named."""


# a warning points at the first frame outside these packages: the caller's `opt.step()` line
INSIDE = (str(Path(__file__).resolve().parent.parent), str(Path(torch.__file__).resolve().parent))


class DivergenceWarning(UserWarning):
    """The weights a Symo kind updates grow by orders of magnitude within a few steps: the rate is too high."""


def sketch(x: torch.Tensor) -> torch.Tensor:
    """`SKETCH` entries of a block's coordinates, evenly spaced, copied (the block may be a view of the weights)."""
    flat = x.reshape(-1)
    return flat[::max(1, flat.numel() // SKETCH)][:SKETCH].detach().to(torch.float64, copy=True)


def caller_level() -> int:
    """The `stacklevel` that makes a warning issued by this function's caller name the first frame outside
    Symo and torch."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(INSIDE):
        frame, level = frame.f_back, level + 1
    return level


class DivergenceWatch:
    """Follows the weights one kind updates; `weights` before each step's update, `updates` after it."""

    def __init__(self, kind: str, growth: float = GROWTH, window: int = WINDOW) -> None:
        self.kind, self.growth, self.window = kind, growth, window
        self.norms: deque[tuple[int, float]] = deque(maxlen=window + 1)  # (step, norm) of the last steps
        self.previous: dict[str, torch.Tensor] = {}  # block id -> sketch of the weights the last update was for
        self.previous_z: dict[str, torch.Tensor] = {}  # block id -> sketch of the last update's direction
        self.latest: dict[str, torch.Tensor] = {}
        self.warned = False

    def weights(self, step: int, blocks: dict[str, torch.Tensor]) -> None:
        """This step's weights, {block id: coordinates}, before its update; warns when they diverge."""
        if self.warned or not blocks:
            return
        self.previous, self.latest = self.latest, {bid: sketch(w) for bid, w in blocks.items()}
        norm = float(torch.stack([torch.linalg.vector_norm(w.detach(), dtype=torch.float64)
                                  for w in blocks.values()]).norm())
        if not math.isfinite(norm):
            return  # the non-finite values are the optimizer's check_finite's to report
        self.norms.append((step, norm))
        start = min((entry for entry in self.norms if entry[1] > 0), key=lambda e: e[1], default=None)
        if start is None or norm < self.growth * start[1]:
            return
        self.warned = True
        warnings.warn(self.message(step, norm, start), DivergenceWarning, stacklevel=caller_level())

    def updates(self, blocks: dict[str, torch.Tensor]) -> None:
        """This step's directions z, {block id: coordinates}: what the optimizer multiplies by -lr."""
        if not self.warned:
            self.previous_z = {bid: sketch(z) for bid, z in blocks.items()}

    def rate(self) -> float | None:
        """The learning rate of the last step, fitted from the weights' change; None where the fit does not hold."""
        ids = [bid for bid in self.previous_z if bid in self.previous and bid in self.latest]
        if not ids:
            return None
        w0 = torch.cat([self.previous[b] for b in ids])
        z = torch.cat([self.previous_z[b] for b in ids])
        delta = torch.cat([self.latest[b] for b in ids]) - w0
        if float(delta.norm()) == 0.0:
            return None
        # delta = -lr z - (lr wd) w0: least squares in (lr, lr wd), then lr alone (no weight decay)
        for columns in (torch.stack([z, w0], dim=1), z[:, None]):
            coef = torch.linalg.lstsq(columns, -delta[:, None]).solution[:, 0]
            residual = float((delta + columns @ coef).norm() / delta.norm())
            if residual <= FIT_TOLERANCE and float(coef[0]) > 0 and float(coef[-1]) >= 0:  # lr > 0, wd >= 0
                return float(coef[0])
        return None

    def message(self, step: int, norm: float, start: tuple[int, float]) -> str:
        lr = self.rate()
        at = f"learning rate {lr:.3g}" if lr is not None else "its learning rate"
        lower = f" (lr={lr / 10:.2g} to {lr / 3:.2g})" if lr is not None else ""
        return (f"Symo's {self.kind} step is diverging at {at}: the norm of the weights it updates grew "
                f"{norm / start[1]:.0f}x in {step - start[0]} steps ({start[1]:.3g} at step {start[0]}, {norm:.3g} "
                f"at step {step}), and the loss climbs by orders of magnitude from here. The {self.kind} step's rate "
                "does not transfer between problems (its update scales with the weights, not with the gradients): "
                f"lower it 3-10x{lower} and tune it on this problem on a factor-3 grid")
