"""The run folder's log of `symo train`: `log.csv` (one row per step) and `loss.png` (the curves)."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

COLUMNS = ("step", "lr", "train_loss", "val_loss", "elapsed_s")


def write_csv(path: Path, history: dict[str, list[float]]) -> Path:
    """Rewrite the whole log (atomically); val_loss is empty on steps without an evaluation."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(COLUMNS)
        for values in zip(*(history[c] for c in COLUMNS)):
            out.writerow(["" if math.isnan(v) else (int(v) if c == "step" else f"{v:.6g}")
                          for c, v in zip(COLUMNS, values)])
    os.replace(tmp, path)
    return path


def smooth(values: list[float], beta: float = 0.9) -> list[float]:
    """Bias-corrected exponential moving average (NaNs skipped)."""
    out, avg, n = [], 0.0, 0
    for v in values:
        if not math.isnan(v):
            n += 1
            avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** n) if n else float("nan"))
    return out


def write_plot(path: Path, history: dict[str, list[float]], title: str = "") -> Path | None:
    """Train loss (raw and smoothed) and validation loss against the step; None without matplotlib."""
    try:
        # matplotlib is optional (the bench extra) and heavy: loaded only to plot
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # (optional, as above)
    except ImportError:
        return None
    steps, train, val = history["step"], history["train_loss"], history["val_loss"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(steps, train, color="tab:blue", alpha=0.25, lw=0.8)
    ax.plot(steps, smooth(train), color="tab:blue", label="train (smoothed)")
    pts = [(s, v) for s, v in zip(steps, val) if not math.isnan(v)]
    if pts:
        ax.plot(*zip(*pts), "o-", color="tab:orange", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / char)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
