"""The report of benchmarks/lr_transfer.py: each spec column's table (best rate over the documented one, the goal,
the recommended rate, the other update scales) and the markdown written to benchmarks/results/lr_transfer.md."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from benchmarks.lr_transfer_grid import (
    GOAL,
    GRID_CENTRE,
    MUON_STYLE_PRESETS,
    NOT_MEASURED,
    ROUNDING,
    SCALE_CENTRE,
    SPEC_LABEL,
    SPREAD_LIMIT,
    Cell,
    not_measured,
    recommend,
    spread,
)


def summarise(cells: dict[tuple, Cell], presets: list[str], small: list[str], documented: dict[str, float],
              spec: str = "true", columns: list[str] | None = None) -> dict:
    """One spec's table: cells {(preset, scale or None, problem): Cell} of that spec."""
    columns = list(columns) if columns is not None else list(dict.fromkeys(
        [*small, *(q for (_p, s, q) in cells if s is None)]))
    table: dict[str, Any] = {}
    for p in presets:
        own = {q: c for (pp, s, q), c in cells.items() if pp == p and s is None}
        best = {q: c.best for q, c in own.items() if c.best is not None}
        rec = recommend(list(best.values())) if best else None
        table[p] = {
            "documented": documented[p], "grid_centre": GRID_CENTRE[p],
            "cells": {q: {"best_lr": c.best, "bound": c.bound, "ratio": (c.best / documented[p]) if c.best else None,
                          "grid": {f"{lr:g}": v for lr, v in sorted(c.finals.items())}, "source": c.source,
                          "run_seconds": c.seconds} for q, c in own.items()},
            "not_measured": {q: why for q in columns if q not in own and (why := not_measured(p, spec, q))},
            "spread": (max(best.values()) / min(best.values())) if best else None,
            "spread_small": spread([own[q] for q in small if q in own]),
            "recommended": rec,
            "worst_ratio_at_recommended": max(max(b / rec, rec / b) for b in best.values()) if best else None,
            "worst_ratio_at_documented": max(max(b / documented[p], documented[p] / b) for b in best.values())
            if best else None,
        }
        scales = {}
        for s in sorted({s for (pp, s, _q) in cells if pp == p and s}):
            alt = {q: c for (pp, ss, q), c in cells.items() if pp == p and ss == s}
            best_alt = [c.best for c in alt.values() if c.best is not None]
            scales[s] = {"grid_centre": SCALE_CENTRE[s], "spread_small": spread(list(alt.values())),
                         "recommended": recommend(best_alt) if best_alt else None,
                         "cells": {q: {"best_lr": c.best, "bound": c.bound, "final": c.finals.get(c.best),
                                       "own_scale_final": own[q].finals.get(own[q].best) if q in own else None,
                                       "grid": {f"{lr:g}": v for lr, v in sorted(c.finals.items())}}
                                   for q, c in alt.items()}}
        table[p]["update_scales"] = scales
    within = [within_goal(c) for t in table.values() for c in t["cells"].values() if c["ratio"] is not None]
    return {"spec": spec, "label": SPEC_LABEL.get(spec, spec), "columns": columns, "presets": table,
            "goal": f"best / documented within {GOAL:g}x everywhere",
            "goal_met": all(within), "cells_within_goal": sum(within), "cells_measured": len(within)}


def summarise_specs(per_spec: dict[str, dict]) -> dict:
    """The spec tables (summarise's) and the goal over all of them."""
    return {"specs": per_spec, "goal": f"best / documented within {GOAL:g}x everywhere, per spec",
            "goal_met": all(t["goal_met"] for t in per_spec.values()),
            "cells_within_goal": sum(t["cells_within_goal"] for t in per_spec.values()),
            "cells_measured": sum(t["cells_measured"] for t in per_spec.values())}


def within_goal(cell: dict) -> bool:
    """best / documented within GOAL either way; a best still at a grid edge (a bound) does not count."""
    return not cell["bound"] and abs(math.log(cell["ratio"])) <= math.log(GOAL * ROUNDING)


def _ratio_text(c: dict) -> str:
    if c["ratio"] is None:
        return "pending" if c["source"].startswith("pending") else "-"
    r = c["ratio"]
    text = f"{r:.2g}x" if r >= 0.095 else f"1/{1 / r:.2g}x"
    return f"{c['bound']}{text}"


def cell_text(t: dict, q: str, text: Callable[[dict], str]) -> str:
    """A table cell of problem `q` in preset row `t`: `text` of a measured cell, else why it is not measured."""
    if q in t["cells"]:
        return text(t["cells"][q])
    return "not measured" if q in t.get("not_measured", {}) else "-"


def _processes(workers: int) -> str:
    return "one process" if workers <= 1 else f"{workers} processes"


def _goal_text(x: dict) -> str:
    return f"{'met' if x['goal_met'] else 'not met'}, {x['cells_within_goal']} of {x['cells_measured']} cells"


def markdown(data: dict) -> str:
    meta, specs = data["meta"], data["specs"]
    problems_seen = list(dict.fromkeys(q for t in specs.values() for q in t["columns"]))
    small = [q for q in problems_seen if q != "nanogpt"]
    muon_style = ", ".join(meta.get("muon_style_presets", MUON_STYLE_PRESETS))
    lines = ["# Learning-rate transfer: each preset's best rate over its documented one", "",
             f"Command: `{meta['command']}` ({meta['runs']} runs, {meta['run_seconds'] / 60:.0f} min of training "
             f"recorded in them, {_processes(meta.get('workers', 1))} with one thread each on 2 shared CPU cores; "
             "this invocation took "
             f"{meta['wall_s'] / 60:.0f} min, the runs its caches held were not trained again).", "",
             "Per preset, spec and problem: a factor-3 grid of 3 rates centred on the rate the preset was "
             "documented with when this was measured (column `grid centre` below), seed 0, the benchmark's own "
             "model, data, length, schedule and metric (final test loss; the RNN's final eval MSE; nanoGPT's final "
             "validation loss); a best rate at an edge extends the grid by one point, at most twice, and `>=`/`<=` "
             "marks a best still at an edge after that (such a cell does not count as within the goal). "
             "paper_mlp's preset runs use a constant rate (as its tuned rows do; its `symo` row uses the paper's "
             "decaying schedule). nanoGPT cells: see the sources below; those without one are trained here.", "",
             "Two specs per problem. **True-symmetry spec**: each benchmark's own spec, the network's true group "
             "(hidden units permuted; every preset on the small problems). **Muon-style spec**: a private "
             "signed_perm row space per weight matrix, the rest (biases) to Symo's AdamW, whose rate follows lr "
             "(3e-3 at the preset's documented rate): specs/muon.toml on the MLPs (train_mlp, the autoencoder, "
             "paper_mlp, every weight matrix as each benchmark's own Muon baseline), specs/rnn_muon.toml on the RNN; "
             f"measured for {muon_style} (the other presets on the true spec only). "
             "`symo.infer.training_spec` was not used: it leaves the first layer and the classifier to AdamW, "
             "which on train_mlp's and paper_mlp's two-layer networks is every weight, and cannot guess the RNN's "
             "inputs. nanoGPT's columns: gpt_true on the true-symmetry spec (per-head O(d_head) on attention, perm "
             "on each MLP's hidden units; embeddings, gains and attention/MLP output biases to AdamW), gpt_muon on "
             "the Muon-style spec, every preset on both; their runs, by `symo train`, give the AdamW side a fixed "
             "3e-3. The campaign's gpt_true runs under Muon's scale (nanogpt_matrix's defaults, then_orthogonalize "
             "and SOAP-Muon arms) ran with `parameter_rms=False`, no longer the default, so the muon, "
             "then_orthogonalize and soap_muon cells on gpt_true are trained here, under today's default. soap "
             "and soap_muon on the autoencoder's true spec are the costliest cells (fc2 and fc3, both axes "
             "permuted, are each one block whose two-sided factor is 4096 x 4096: about 8 min a run on a loaded "
             "core). Not measured: "
             + "; ".join(f"the preset {p}" for p in meta.get("presets_not_measured", [])) + ". "
             "Runs whose code changed after the committed run caches were made carry a new cache key: true-spec "
             "runs under Muon's scale (`/parameter_rms`: a parameter whose blocks are not its own rows x cols now "
             "moves at Muon's per-shape RMS) and eigen_adam's true-spec runs (`/soap_conventions`: the kind now "
             "defaults to SOAP's conventions). The other true-spec runs are the cached ones (today's code "
             "reproduces them bit for bit); every small problem's true spec covers all its parameters, so the "
             "AdamW side's new rate changes none of them.", "",
             f"## Best rate / documented rate (goal: within {GOAL:g}x everywhere, per spec: {_goal_text(data)})"]
    for st in specs.values():
        cols = st["columns"]
        lines += ["", f"### {st['label'][0].upper() + st['label'][1:]} (goal: {_goal_text(st)})", "",
                  "| preset | documented lr | " + " | ".join(cols) + " | within 3x |",
                  "|---|---:|" + "---:|" * len(cols) + "---|"]
        for p, t in st["presets"].items():
            ok = all(within_goal(c) for c in t["cells"].values() if c["ratio"])
            lines.append(f"| {p} | {t['documented']:g} | " + " | ".join(cell_text(t, q, _ratio_text) for q in cols)
                         + f" | {'yes' if ok else 'no'} |")
    lines += ["", "## Best rates and the recommendation", "",
              "The rate that makes the worst ratio smallest is the geometric midpoint of a preset's best rates on "
              "one spec (rounded to 1, 1.5, 2, 3, 5 or 7 x 10^k); `worst ratio` is the largest of best/rate and "
              "rate/best over that spec's measured cells.", "",
              "| preset | spec | grid centre | " + " | ".join(problems_seen) + " | spread | recommended | worst ratio "
              "at recommended | at grid centre |",
              "|---|---|---:|" + "---:|" * len(problems_seen) + "---:|---:|---:|---:|"]

    def best_text(c: dict) -> str:
        return f"{c['bound']}{c['best_lr']:g}" if c["best_lr"] else "pending"

    for spec, st in specs.items():
        for p, t in st["presets"].items():
            worst_c = max((max(c["best_lr"] / t["grid_centre"], t["grid_centre"] / c["best_lr"])
                           for c in t["cells"].values() if c["best_lr"]), default=None)
            lines.append(f"| {p} | {spec} | {t['grid_centre']:g} | "
                         + " | ".join(cell_text(t, q, best_text) for q in problems_seen) + " | "
                         + (f"{t['spread']:.3g}x | {t['recommended']:g} | {t['worst_ratio_at_recommended']:.2g}x | "
                            f"{worst_c:.2g}x |" if t["spread"] else "- | - | - | - |"))
    true = specs.get("true", {"presets": {}})["presets"]
    alt_rows = [(p, s, a) for p, t in true.items() for s, a in t["update_scales"].items()]
    if alt_rows:
        lines += ["", f"## Other update scales for the presets whose best rates on the true spec spread over "
                  f"{SPREAD_LIMIT:g}x", "",
                  "The same true-spec grids on the small problems under the update scales the preset's kind "
                  "accepts: `adamw` rescales each block's update to RMS 0.2 (AdamW's rates, grid centred on "
                  "3e-3), `muon` is Muon's shape scale (grid centred on 0.02). A preset keeps its own scale; "
                  "these are measured alternatives (not measured on the Muon-style spec). Cells: best rate (its "
                  "final loss / the final loss of the preset's own scale at its best rate).", "",
                  "| preset | scale | " + " | ".join(small) + " | spread | spread at own scale | recommended |",
                  "|---|---|" + "---:|" * len(small) + "---:|---:|---:|"]
        for p, s, a in alt_rows:
            cells = []
            for q in small:
                c = a["cells"].get(q)
                if not c or c["best_lr"] is None:
                    cells.append("not measured" if q in true[p].get("not_measured", {}) else "-")
                    continue
                rel = (f" ({c['final'] / c['own_scale_final']:.2g})" if c["own_scale_final"] and
                       math.isfinite(c["final"]) and c["own_scale_final"] > 0 else "")
                cells.append(f"{c['bound']}{c['best_lr']:g}{rel}")
            spread_own = true[p]["spread_small"]
            lines.append(f"| {p} | {s} | " + " | ".join(cells) + f" | {a['spread_small']:.3g}x | "
                         + (f"{spread_own:.3g}x" if spread_own else "-") + f" | {a['recommended']:g} |")
    lines += ["", "## Grids (seed 0: rate: final loss)", ""]
    for spec, st in specs.items():
        for p, t in st["presets"].items():
            for q, c in t["cells"].items():
                grid = ", ".join(f"{lr}: {v:.4g}" for lr, v in c["grid"].items()) or c["source"]
                src = "" if c["source"] == "trained" else f" ({c['source']})"
                lines.append(f"- {p}, {spec} spec, {q}{src}: {grid}")
            for q, why in t.get("not_measured", {}).items():
                if (p, spec, q) in NOT_MEASURED:
                    lines.append(f"- {p}, {spec} spec, {q}: {why}")
            for s, a in t["update_scales"].items():
                for q, c in a["cells"].items():
                    lines.append(f"- {p} at update_scale={s}, {spec} spec, {q}: "
                                 + ", ".join(f"{lr}: {v:.4g}" for lr, v in c["grid"].items()))
    return "\n".join(lines)
