"""Which cells benchmarks/lr_transfer.py measures and how a cell's learning-rate grid grows: the grids' centres,
the presets and problems per spec column, where nanoGPT cells come from, the run keys of code that changed, and the
rule (a factor-3 grid, extended at an edge at most twice, the best rate, the recommended rate), with `Cell`, one
(preset, scale, problem) on one spec column. Pure data and functions; the runs are lr_transfer.py's, the report
lr_transfer_report.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.preset_arms import SPECS

# the presets' documented rates when this table was measured: every grid is centred here
GRID_CENTRE = {"published": 0.1, "notebook": 0.03, "muon": 0.02, "shampoo": 0.05, "eigen_adam": 3e-3,
               "soap": 3e-3, "then_orthogonalize": 0.02, "soap_muon": 0.02}
SCALE_CENTRE = {"adamw": 3e-3, "muon": 0.02}  # the alternative update scales' grids
FACTOR, EXTENSIONS = 3.0, 2
GOAL, SPREAD_LIMIT = 3.0, 9.0
# grid rates are rounded to 3 significant digits (grid_rate), so one factor-3 step measures 3 +- 0.2%:
# ratios and spreads within this tolerance of the limits count as at them
ROUNDING = 1.005
PROBLEMS = ("train_mlp tanh", "train_mlp linear", "mnist_autoencoder", "rnn_train", "paper_mlp tanh",
            "paper_mlp linear", "nanogpt")
SMALL = PROBLEMS[:-1]
NANOGPT_SPECS = {"true": "gpt_true", "muon": "gpt_muon"}  # nanoGPT's spec in each spec column


def _matrix_sources(spec: str, presets: tuple[str, ...]) -> dict[str, tuple[str, str | None, str, str]]:
    """nanogpt_matrix's screening-pass arms (the small size) that are a preset as it is now, on `spec`."""
    arms = {"published": ("published", "H_inv refreshed every 10 steps"),
            # nanogpt_matrix's arm "eigen_adam" keeps the kind's older conventions; "one_sided_soap" is the
            # eigen_adam preset as it is now
            "eigen_adam": ("one_sided_soap", ""), "soap": ("soap", ""),
            "then_orthogonalize": ("then_orthogonalize", ""), "soap_muon": ("soap_muon", "")}
    return {p: ("nanogpt_matrix.json", "screen", f"symo_{arms[p][0]}_{spec}", arms[p][1]) for p in presets}


# nanoGPT cells taken from other results, per spec column: preset -> (results file, regime or None, arm, what
# differs). Not the campaign's gpt_true arms under Muon's update scale (defaults, then_orthogonalize, soap_muon):
# they ran with parameter_rms=False, no longer the default, so the muon and then_orthogonalize cells of the true
# column are trained here.
NANOGPT_SOURCES = {
    "muon": {"notebook": ("nanogpt_compare.json", None, "symo_muon_notebook", ""),
             "muon": ("nanogpt_compare.json", None, "muon", ""),
             **_matrix_sources("gpt_muon", ("published", "eigen_adam", "soap", "then_orthogonalize", "soap_muon"))},
    "true": _matrix_sources("gpt_true", ("published", "eigen_adam", "soap")),
}
# nanoGPT cells trained here (benchmarks.nanogpt_compare.run_one: symo train with the spec and the preset), per
# spec column
NANOGPT_TRAINED = {"muon": ("shampoo",), "true": ("muon", "then_orthogonalize", "notebook", "shampoo", "soap_muon")}
# the spec columns: "true", the benchmark's own spec (the network's true group); "muon", a Muon-style spec
SPEC_LABEL = {"true": "true-symmetry spec", "muon": "Muon-style spec"}
# the presets measured on the small problems' Muon-style specs
MUON_STYLE_PRESETS = ("muon", "then_orthogonalize", "eigen_adam", "soap", "soap_muon")
# (preset, spec, problem) -> why its cell is not measured
NOT_MEASURED: dict[tuple[str, str, str], str] = {}
# code changes since the committed caches were made, for runs whose keys did not say so: preset -> key tag
CHANGED_PRESETS = {"eigen_adam": "soap_conventions"}  # eigen_adam's kind now defaults to SOAP's conventions
# Muon-style runs (whose biases go to Symo's AdamW, at lr x 3e-3 / the documented rate) made before a preset's
# documented rate moved: eigen_adam's and soap's went from 3e-3 to 9e-3, so their AdamW side is now a third of lr
CHANGED_MUON_STYLE = {"eigen_adam": "documented9e-3", "soap": "documented9e-3"}


# ------------------------------------------------------------------ the rule (pure functions, tested)
def grid_rate(x: float) -> float:
    """A grid rate, rounded to 3 significant digits, so run keys are stable."""
    return float(f"{x:.3g}")


def first_grid(centre: float) -> list[float]:
    return [grid_rate(centre / FACTOR), grid_rate(centre), grid_rate(centre * FACTOR)]


def best_of(finals: dict[float, float]) -> float:
    """The rate of the lowest final loss (ties: the smaller rate)."""
    return min(finals, key=lambda lr: (finals[lr] if math.isfinite(finals[lr]) else math.inf, lr))


def extension(finals: dict[float, float]) -> float | None:
    """The next rate to try when the best is at the grid's edge (None inside)."""
    lrs = sorted(finals)
    best = best_of(finals)
    if best == lrs[0]:
        return grid_rate(lrs[0] / FACTOR)
    if best == lrs[-1]:
        return grid_rate(lrs[-1] * FACTOR)
    return None


def nice(x: float) -> float:
    """x rounded, in log scale, to 1, 1.5, 2, 3, 5 or 7 x 10^k."""
    k = math.floor(math.log10(x))
    candidates = [m * 10.0 ** e for e in (k - 1, k, k + 1) for m in (1, 1.5, 2, 3, 5, 7)]
    return float(f"{min(candidates, key=lambda c: abs(math.log(c / x))):.3g}")


def recommend(best: list[float]) -> float:
    """The rate that makes the worst ratio best / rate smallest: the geometric midpoint of the extremes."""
    return nice(math.sqrt(min(best) * max(best)))


def own_scale(preset: str) -> str:
    """The update scale a preset uses as it is."""
    from symo.optim.presets import PRESETS

    return PRESETS[preset].values.get("update_scale", "natural")


def key_suffix(preset: str, scale: str | None, spec: str) -> str:
    """The tag appended to a run's cache key where the code the run uses changed after the committed caches were
    made, so that a stale run is never reused; '' for runs the caches hold as they are now. True-spec runs under
    Muon's update scale: "/parameter_rms" (a parameter whose blocks are not its own rows x cols now moves at
    Muon's per-shape RMS); eigen_adam's true-spec runs: "/soap_conventions"; eigen_adam's and soap's Muon-style
    runs: "/documented9e-3" (their AdamW side follows lr from the new documented rate). The AdamW side's rate,
    which now follows lr, leaves every true-spec run as it was: the small problems' true specs cover every
    parameter (uncovered_parameters)."""
    if spec not in SPECS:
        raise ValueError(f"unknown spec variant {spec!r}; use one of {SPECS}")
    if spec != "true":
        return "/" + CHANGED_MUON_STYLE[preset] if preset in CHANGED_MUON_STYLE else ""
    tags = [CHANGED_PRESETS[preset]] if preset in CHANGED_PRESETS else []
    if (scale or own_scale(preset)) == "muon":
        tags.append("parameter_rms")
    return "".join("/" + t for t in tags)


def spec_presets(spec: str, presets: list[str]) -> list[str]:
    """The presets of `presets` measured on the small problems under `spec`, in `presets`' order."""
    return [p for p in presets if spec == "true" or p in MUON_STYLE_PRESETS]


def not_measured(preset: str, spec: str, problem: str) -> str | None:
    """Why the cell (preset, spec, problem) is not measured; None when it is."""
    if spec == "muon" and problem != "nanogpt" and preset not in MUON_STYLE_PRESETS:
        return "not measured: this preset is measured on the small problems' true spec only"
    return NOT_MEASURED.get((preset, spec, problem))


@dataclass
class Cell:
    """One (preset, scale, problem) on one spec variant: its seed-0 grid, grown at an edge at most EXTENSIONS
    times."""

    preset: str
    scale: str | None
    problem: str
    finals: dict[float, float] = field(default_factory=dict)
    todo: list[float] = field(default_factory=list)
    extensions: int = 0
    seconds: float = 0.0
    source: str = "trained"
    spec: str = "true"

    def record(self, lr: float, final: float, seconds: float) -> None:
        self.finals[lr] = final
        self.seconds += seconds

    def advance(self) -> None:
        """After a round: the next rate due, if the best sits at an edge and extensions are left."""
        self.todo = []
        nxt = extension(self.finals) if self.finals else None
        if nxt is not None and self.extensions < EXTENSIONS and nxt not in self.finals:
            self.extensions += 1
            self.todo = [nxt]

    @property
    def best(self) -> float | None:
        return best_of(self.finals) if self.finals else None

    @property
    def bound(self) -> str:
        """'>=' or '<=' when the best is still at an edge of the grid (the optimum may lie beyond), else ''."""
        if not self.finals or extension(self.finals) is None:
            return ""
        return "<=" if self.best == min(self.finals) else ">="


def spread(cells: list[Cell]) -> float | None:
    best = [c.best for c in cells if c.best is not None]
    return max(best) / min(best) if len(best) > 1 else None
