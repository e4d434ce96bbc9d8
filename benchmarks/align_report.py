"""benchmarks/align.py's output: align.{json,md,png}, where a run of some cases keeps the other cases' rows and
notes."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"


CACHE = RESULTS / "align_cache"


CASES = ["mnist_mlp", "fashion_rescnn", "gpt", "gpt_adamw", "mha", "gpt2_speed"]


TITLES = {"mnist_mlp": "MNIST MLP (3 x 512 ReLU), test set",
          "fashion_rescnn": "Residual CNN with BatchNorm, test set",
          "gpt": "Character GPT 4 x 128 trained with Symo, validation",
          "gpt_adamw": "Character GPT 4 x 128 trained with AdamW, validation",
          "mha": "nn.MultiheadAttention classifier on MNIST rows, test set",
          "gpt2_speed": "Align time at GPT-2 small widths"}


def committed_notes() -> dict[str, str]:
    """Each case's note as the committed align.md has it (the first paragraph under its title), so a run of
    some cases keeps the others' notes where the cache's notes.json is gone."""
    md = RESULTS / "align.md"
    if not md.is_file():
        return {}
    by_title = {v: k for k, v in TITLES.items()}
    notes = {}
    for section in md.read_text().split("\n## ")[1:]:
        title, _, body = section.partition("\n\n")
        if title.strip() in by_title and body.strip():
            notes[by_title[title.strip()]] = body.split("\n\n")[0].strip()
    return notes


def write(results: dict, notes: dict, argv: str, seconds: float) -> None:
    """align.{json,md,png}; cases not run this time keep their previous rows and notes."""
    RESULTS.mkdir(exist_ok=True)
    old = RESULTS / "align.json"
    old_notes = CACHE / "notes.json"
    if old.is_file():
        results = {**json.loads(old.read_text()), **results}
    if old_notes.is_file():
        notes = {**json.loads(old_notes.read_text()), **notes}
    notes = {**committed_notes(), **notes}
    CACHE.mkdir(parents=True, exist_ok=True)
    old_notes.write_text(json.dumps(notes))
    results = {c: results[c] for c in CASES if c in results}
    (RESULTS / "align.json").write_text(json.dumps(results, indent=1))
    lines = ["# Aligning and merging models modulo their symmetry", "", f"Command: `{argv}`", "",
             f"torch {torch.__version__}, {platform.machine()}, one torch thread, shared 2-core machine; "
             f"{seconds / 60:.1f} min in all (trained models are cached in benchmarks/results/align_cache and "
             "reused).", "",
             "Barrier = the largest rise of the loss above the straight line between the end points' losses along "
             "(1 - alpha) A + alpha B (11 points; for accuracy the largest drop below its line). Midpoint = alpha "
             "0.5.", ""]
    for case, rows in results.items():
        lines += [f"## {TITLES[case]}", "", notes.get(case, "(notes: see the run that wrote these rows)"), ""]
        if case == "gpt2_speed":
            lines += ["| layers | parameters | spaces | sweeps | align seconds | matching seconds | best start |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {k.split()[0]} | {r['params']:,} | {r['spaces']} | {r['sweeps']} | "
                      f"{r['align_seconds']:.1f} | {r['match_seconds']:.1f} | {r['start']} |" for k, r in rows.items()]
        else:
            ends = rows["naive"]["end_losses"]
            naive = rows["naive"]["barrier_loss"]
            lines += [f"End points: loss {ends[0]:.4f} (A), {ends[1]:.4f} (B).", "",
                      "| method | loss barrier | of the naive barrier removed | accuracy barrier | midpoint loss | "
                      "midpoint accuracy | align s |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {m} | (not applied: {r['skipped']}) | | | | | |" if "skipped" in r else
                      f"| {m} | {r['barrier_loss']:.4f} | {100 * (1 - r['barrier_loss'] / naive):.0f}% | "
                      f"{100 * r['barrier_acc']:.2f}% | {r['midpoint_loss']:.4f} | {100 * r['midpoint_acc']:.2f}% | "
                      f"{r['align_seconds']:.2f} |" for m, r in rows.items()]
        lines.append("")
    (RESULTS / "align.md").write_text("\n".join(lines))
    plot(results)


def plot(results: dict) -> None:
    try:
        import matplotlib  # optional (the bench extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # (the same optional dependency)
    except ImportError:
        return
    cases = [c for c in ("mnist_mlp", "fashion_rescnn", "gpt", "gpt_adamw", "mha") if c in results]
    fig, axes = plt.subplots(1, len(cases) + ("gpt2_speed" in results), figsize=(4.2 * (len(cases) + 1), 6.0))
    axes = np.atleast_1d(axes)
    for ax, case in zip(axes, cases):
        for method, r in results[case].items():
            if "skipped" in r:
                continue
            ax.plot(r["alphas"], r["losses"], marker="o", ms=3, label=method)
        ax.set_title(case)
        ax.set_xlabel("alpha (0: A, 1: B aligned)")
        ax.set_ylabel("loss")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.2))  # below: long method names
    if "gpt2_speed" in results:
        rows = list(results["gpt2_speed"].values())
        axes[-1].plot([r["spaces"] for r in rows], [r["align_seconds"] for r in rows], marker="o")
        axes[-1].set_xlabel("spaces (GPT-2 small widths)")
        axes[-1].set_ylabel("align seconds")
        axes[-1].set_title("gpt2_speed")
    fig.tight_layout()
    fig.savefig(RESULTS / "align.png", dpi=110)
    plt.close(fig)
