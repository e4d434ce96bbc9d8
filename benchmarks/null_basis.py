"""SOAP's null directions in the coordinate basis: `null_basis="coordinates"` beside eigh's basis on nanoGPT.

After SOAP's first gradient, a wide side's statistic G G^T has a null space (256 of 384 directions for a 384 x 128
matrix), and eigh returns an orthonormal basis of it that float32 rounding alone decides. Adam's normalisation
in that basis is SOAP's first update in the directions the next gradients open, so two runs from initial weights
1e-7 apart differ by about their whole first update (benchmarks/soap_seeds.py). `null_basis="coordinates"` gives
those directions the orthonormal basis of their span nearest the parameter's coordinate axes instead. This script
asks whether that makes SOAP's runs reproducible and whether it trains better or worse:

- first update: on the reference GPT, the relative difference of the hidden matrices' displacement after the first
  update (two steps) between runs from initial weights 1e-7 apart, and after six steps, with either basis;
- six seeds, both regimes: SOAP-Muon, `soap_heavyball` and `soap` with the coordinate basis, each at the
  campaign's tuned rate and decay for the arm with eigh's basis, paired with that arm's runs
  (benchmarks/soap_seeds.py holds seeds 3-5, the campaign seeds 0-2);
- floor (reference regime): SOAP-Muon with either basis, and Muon as the control, at seeds 0-2 from initial weights
  moved by 1e-7, each paired with its own unperturbed runs, beside heavyball's SOAP's floor from soap_seeds; and
  the FLOOR_VARIANTS of SOAP-Muon, each with its own unperturbed runs: the coordinate basis with `refresh=Eigh()`,
  whose every refresh takes that basis again (a QR refresh of a still rank-deficient statistic orthonormalises
  rounding noise: tests/test_null_basis.py), and the coordinate basis with eps 1e-5;
- the first update of SOAP-Muon variants (FIRST_UPDATE_VARIANTS: a larger eps, eigh refreshes, float64
  statistics), to find where its sensitivity to the weights comes from.

    python -m benchmarks.null_basis              # 57 runs of 1-7 minutes on 2 workers (about 270 worker-minutes)
    python -m benchmarks.null_basis --report     # train nothing: the report of what the run caches hold

New runs go to benchmarks/results/null_basis_runs.json. Writes null_basis.{md,json,png}.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import RunCache, mean_std, paired_diff_ci95, write_results
from benchmarks.nanogpt_matrix_report import mean_curve
from benchmarks.nanogpt_matrix_runs import (
    ARMS,
    REGIMES,
    RESULTS,
    follow_up_args,
    job_for,
    records_by_group,
    runs_beside_the_campaign,
)
from benchmarks.soap_seeds import first_update, muon_loss_steps_ratio, tuned
from symo.optim.bases import Eigh

NAME = "null_basis"
MEASURED = ("reference", "data_rich")
FLOOR_REGIME = "reference"
SEEDS, FLOOR_SEEDS = (0, 1, 2, 3, 4, 5), (0, 1, 2)
PERTURBATION = 1e-7
BASES = ("symo_soap_muon_gpt_muon", "symo_soap_heavyball_gpt_muon", "symo_soap_gpt_muon")
COORDINATES = {base: f"{base}_null_coordinates" for base in BASES}
FLOOR_BASE = "symo_soap_muon_gpt_muon"
FLOOR_KEY = f"{COORDINATES[FLOOR_BASE]}_init_perturbed"
EIGH_FLOOR_KEY = f"{FLOOR_BASE}_init_perturbed"  # the same optimizer with eigh's basis
MUON_FLOOR_KEY = "muon_init_perturbed"  # the control: Muon, whose first update rounding does not decide
# SOAP-Muon's first updates with one thing changed more: where does its sensitivity to the weights come from?
FIRST_UPDATE_VARIANTS: dict[str, dict[str, Any]] = {
    "eps 1e-06 (SOAP's: 1e-8)": {"eps": 1e-6},
    "eps 1e-05 (SOAP's: 1e-8)": {"eps": 1e-5},
    "coordinate null basis, eps 1e-05": {"null_basis": "coordinates", "eps": 1e-5},
    "coordinate null basis, eigh refreshes": {"null_basis": "coordinates", "refresh": Eigh()},
    "coordinate null basis, eigh refreshes, float64 statistics": {"null_basis": "coordinates", "refresh": Eigh(),
                                                                  "stats_dtype": "float64"},
}
# the variants whose floor is measured too, with their own unperturbed runs: name -> (variant, its runs' group).
# eigh_refresh: every refresh an eigh that gives the null directions the coordinate basis again; coordinates_eps:
# the coordinate basis with eps 1e-5, which damps the first update's sensitivity 8x where eigh's basis does not
FLOOR_VARIANTS = {
    "eigh_refresh": ("coordinate null basis, eigh refreshes", f"{COORDINATES[FLOOR_BASE]}_eigh_refresh"),
    "coordinates_eps": ("coordinate null basis, eps 1e-05", f"{COORDINATES[FLOOR_BASE]}_eps1e-05"),
}


def changed_arm(base: str, changes: dict[str, Any], what: str) -> dict[str, Any]:
    """The campaign arm `base` with the options `changes` changed and nothing else, its label ending in `what`."""
    arm = ARMS[base]
    return {**arm, "options": {**arm["options"], **changes}, "label": f"{arm['label']}, {what}"}


def coordinate_arm(base: str) -> dict[str, Any]:
    """The campaign arm `base` with null_basis="coordinates" and nothing else changed."""
    return changed_arm(base, {"null_basis": "coordinates"}, "coordinate null basis")


def jobs(chosen: dict[str, dict], regime: str) -> list[dict]:
    """Every run the report reads in `regime`: Muon and each base arm with eigh's basis (the campaign's and
    soap_seeds' runs), each base arm with the coordinate basis, then (in the floor's regime) the perturbed runs.
    The new runs come first in the order a reader wants them: the default step's (SOAP-Muon) before the others."""
    setup, out = REGIMES[regime], []
    for base in BASES:
        lr, wd = chosen[base]["lr"], chosen[base]["weight_decay"]
        for seed in SEEDS:
            job = job_for(regime, setup, COORDINATES[base], lr, wd, seed)
            out.append(dict(job, group=COORDINATES[base], arm_config=coordinate_arm(base)))
    if regime == FLOOR_REGIME:
        # (group, the arm its rate and decay are tuned for, its config, initial weights perturbed)
        floor_runs = [(FLOOR_KEY, FLOOR_BASE, coordinate_arm(FLOOR_BASE), True),
                      (EIGH_FLOOR_KEY, FLOOR_BASE, ARMS[FLOOR_BASE], True),
                      *[(key, FLOOR_BASE, variant_arm(variant), key != own)
                        for variant, own in FLOOR_VARIANTS.values() for key in (own, f"{own}_init_perturbed")],
                      (MUON_FLOOR_KEY, "muon", ARMS["muon"], True)]
        for group, tuned_as, config, perturbed in floor_runs:
            lr, wd = chosen[tuned_as]["lr"], chosen[tuned_as]["weight_decay"]
            for seed in FLOOR_SEEDS:
                out.append(dict(job_for(regime, setup, group, lr, wd, seed), group=group, arm_config=config,
                                **({"init_perturbation": PERTURBATION} if perturbed else {})))
    for arm in ("muon", "soap", *BASES):
        lr, wd = chosen[arm]["lr"], chosen[arm]["weight_decay"]
        out += [dict(job_for(regime, setup, arm, lr, wd, seed), group=arm) for seed in SEEDS]
    return out


def priority(job: dict) -> int:
    """The order new runs are trained in: the default step's (SOAP-Muon) reference runs, its floor, its data-rich
    runs, then the other arms."""
    order = [("reference", COORDINATES[FLOOR_BASE]), ("reference", FLOOR_KEY), ("reference", MUON_FLOOR_KEY),
             ("reference", EIGH_FLOOR_KEY),
             ("data_rich", COORDINATES[FLOOR_BASE])]
    return order.index((job["regime"], job["group"])) if (job["regime"], job["group"]) in order else len(order)


def variant_arm(variant: str) -> dict[str, Any]:
    """SOAP-Muon with the options of FIRST_UPDATE_VARIANTS[variant] changed."""
    return changed_arm(FLOOR_BASE, FIRST_UPDATE_VARIANTS[variant], variant)


def first_update_pairs() -> list[dict]:
    """Each base arm against itself from initial weights 1e-7 apart, with eigh's basis and with the coordinates';
    then SOAP-Muon in each of FIRST_UPDATE_VARIANTS (does a larger eps, an eigh refresh or float64 statistics
    damp what a small change of the weights moves?)."""
    pairs = [{"pair": f"{ARMS[base]['label']}, {basis} null basis, against itself from initial weights 1e-7 apart",
              "arm_a": base, "arm_b": base, "perturbed": True, "basis": basis,
              **({"config_a": coordinate_arm(base), "config_b": coordinate_arm(base)} if basis == "coordinates"
                 else {})}
             for base in BASES for basis in ("eigh", "coordinates")]
    return pairs + [{"pair": f"{variant_arm(v)['label']}, against itself from initial weights 1e-7 apart",
                     "arm_a": FLOOR_BASE, "arm_b": FLOOR_BASE, "perturbed": True,
                     "basis": FIRST_UPDATE_VARIANTS[v].get("null_basis", "eigh"), "variant": v,
                     "config_a": variant_arm(v), "config_b": variant_arm(v)} for v in FIRST_UPDATE_VARIANTS]


def arm_summary(runs: list[dict], muon: list[dict], heavyball: list[dict]) -> dict[str, Any]:
    """Final losses over the seeds, paired intervals against Muon and heavyball's SOAP, Muon-loss steps."""
    finals = [r["final_val"] for r in runs]
    m, sd = mean_std(finals)
    return {"finals": finals, "final_val_mean": m, "final_val_std": sd,
            "diff_to_muon_ci95": list(paired_diff_ci95(finals, [r["final_val"] for r in muon])),
            "diff_to_heavyball_soap_ci95": list(paired_diff_ci95(finals, [r["final_val"] for r in heavyball])),
            "muon_loss_steps_ratio": muon_loss_steps_ratio(runs, muon)}


def summarize(records: dict[str, dict[int, dict]], chosen: dict[str, dict], regime: str) -> dict[str, Any]:
    """Per base arm with a run at every seed under both bases: each basis's summary, and the paired interval of
    (coordinates - eigh); in the floor's regime, the coordinate basis's runs from perturbed weights against its
    own, beside heavyball's SOAP's floor (soap_seeds)."""
    def runs(group: str, seeds: tuple[int, ...] = SEEDS) -> list[dict] | None:
        found = records.get(group, {})
        return [found[s] for s in seeds] if all(s in found for s in seeds) else None

    out: dict[str, Any] = {"arms": {}, "floor": None}
    muon, heavyball = runs("muon"), runs("soap")
    for base in BASES:
        eigh, coords = runs(base), runs(COORDINATES[base])
        if muon is None or heavyball is None or eigh is None or coords is None:
            continue
        out["arms"][base] = {
            "label": ARMS[base]["label"], "lr": chosen[base]["lr"], "weight_decay": chosen[base]["weight_decay"],
            "eigh": arm_summary(eigh, muon, heavyball), "coordinates": arm_summary(coords, muon, heavyball),
            "coordinates_minus_eigh_ci95": list(paired_diff_ci95([r["final_val"] for r in coords],
                                                                 [r["final_val"] for r in eigh]))}
    floors = {"coordinates": (runs(FLOOR_KEY, FLOOR_SEEDS), runs(COORDINATES[FLOOR_BASE], FLOOR_SEEDS)),
              "eigh": (runs(EIGH_FLOOR_KEY, FLOOR_SEEDS), runs(FLOOR_BASE, FLOOR_SEEDS)),
              "muon": (runs(MUON_FLOOR_KEY, FLOOR_SEEDS), runs("muon", FLOOR_SEEDS)),
              **{name: (runs(f"{own}_init_perturbed", FLOOR_SEEDS), runs(own, FLOOR_SEEDS))
                 for name, (_variant, own) in FLOOR_VARIANTS.items()}}
    if regime == FLOOR_REGIME and all(p is not None and o is not None for p, o in floors.values()):
        seeds_report = json.loads((RESULTS / "soap_seeds.json").read_text())["regimes"][regime]["floor"]
        out["floor"] = {"perturbation": PERTURBATION, "seeds": list(FLOOR_SEEDS),
                        "heavyball_soap_perturbed_minus_own": seeds_report["perturbed_minus_heavyball"],
                        "heavyball_soap_perturbed_diff_ci95": seeds_report["perturbed_diff_ci95"]}
        for name, (pert, own) in floors.items():
            out["floor"][f"{name}_perturbed_minus_own"] = [p["final_val"] - o["final_val"] for p, o in zip(pert, own)]
            out["floor"][f"{name}_perturbed_diff_ci95"] = list(paired_diff_ci95([p["final_val"] for p in pert],
                                                                                [o["final_val"] for o in own]))
        for name in ("coordinates", "eigh", "heavyball_soap", "muon", *FLOOR_VARIANTS):
            diffs = out["floor"][f"{name}_perturbed_minus_own"]
            out["floor"][f"{name}_rms_difference"] = math.sqrt(sum(d * d for d in diffs) / len(diffs))
        eigh = [r["final_val"] for r in floors["eigh"][1]]
        out["floor"]["eigh_final_val_mean"] = mean_std(eigh)[0]
        for name in FLOOR_VARIANTS:  # the variant's own runs against SOAP-Muon's defaults
            own = [r["final_val"] for r in floors[name][1]]
            out["floor"][f"{name}_final_val_mean"] = mean_std(own)[0]
            out["floor"][f"{name}_minus_eigh_ci95"] = list(paired_diff_ci95(own, eigh))
    return out


def interval(ci: list[float]) -> str:
    return "[{:+.4f}, {:+.4f}]".format(*ci)


def ratio_text(ratio: float | None) -> str:
    return "not reached" if ratio is None else f"{ratio:.2f}x"


def markdown(summaries: dict[str, dict[str, Any]], first: list[dict], n_runs: int) -> str:
    lines = [
        "# SOAP's null directions in the coordinate basis (`null_basis=\"coordinates\"`) beside eigh's",
        "",
        f"Command: `python -m benchmarks.null_basis` ({n_runs} runs read; Muon, heavyball's SOAP and the arms with "
        "eigh's basis come from the campaign's and soap_seeds' run caches)",
        "",
        "The nanoGPT campaign's regimes (benchmarks/nanogpt_matrix.py). Each arm with the coordinate basis runs at "
        "the campaign's tuned rate and decay for the same arm with eigh's basis (not tuned again), over the same "
        f"{len(SEEDS)} seeds (same initialization and batches per seed across arms). Intervals are paired 95% "
        "intervals of the final validation loss (negative: the row is lower). `Muon-loss steps` = steps the arm's "
        "seed-mean curve takes to reach Muon's mean final loss over the same seeds, as a ratio of Muon's own.",
        "",
        "## The first update",
        "",
        f"Relative difference of the hidden matrices' displacement, {FLOOR_REGIME} GPT, seed 0, tuned rate, no decay, "
        "between runs from initial weights 1e-7 apart (SOAP's first step only builds its statistics: its first "
        "update is the second step):",
        "",
        "| arm | null basis | after the first update (2 steps) | after 6 steps |",
        "|---|---|---|---|",
    ]
    by_key = {(r["arm_a"], r.get("basis", "eigh"), r.get("variant"), r["steps"]): r["relative_difference"]
              for r in first}
    rows = [(base, basis, None) for base in BASES for basis in ("eigh", "coordinates")]
    variants = [(FLOOR_BASE, FIRST_UPDATE_VARIANTS[v].get("null_basis", "eigh"), v) for v in FIRST_UPDATE_VARIANTS]
    for base, basis, variant in rows + variants:
        cells = [f"{by_key[(base, basis, variant, n)]:.2e}" if (base, basis, variant, n) in by_key else "-"
                 for n in (2, 6)]
        label = ARMS[base]["label"] + ("" if variant is None else f", {variant}")
        lines.append(f"| {label} | {basis} | {' | '.join(cells)} |")
    for regime, summary in summaries.items():
        lines += ["", f"## {regime}", "",
                  "| arm | lr | wd | null basis | final val | coordinates - eigh, 95% | diff to Muon, 95% | "
                  "diff to heavyball SOAP, 95% | Muon-loss steps |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for entry in summary["arms"].values():
            for basis in ("eigh", "coordinates"):
                e = entry[basis]
                paired = interval(entry["coordinates_minus_eigh_ci95"]) if basis == "coordinates" else ""
                lines.append(f"| {entry['label']} | {entry['lr']:g} | {entry['weight_decay']:g} | {basis} | "
                             f"{e['final_val_mean']:.4f} ± {e['final_val_std']:.4f} | {paired} | "
                             f"{interval(e['diff_to_muon_ci95'])} | {interval(e['diff_to_heavyball_soap_ci95'])} | "
                             f"{ratio_text(e['muon_loss_steps_ratio'])} |")
        floor = summary["floor"]
        if floor is not None:
            lines += ["", f"Floor ({regime}): the same optimizer from initial weights multiplied by "
                      f"(1 + {floor['perturbation']:g} N(0, 1)), seeds {', '.join(map(str, floor['seeds']))}, against "
                      "its own runs (heavyball's SOAP's row: benchmarks/soap_seeds.py):", "",
                      "| optimizer | per-seed difference in final loss | RMS difference | paired 95% |",
                      "|---|---|---|---|",
                      *[f"| {label} | {', '.join(f'{d:+.4f}' for d in floor[f'{name}_perturbed_minus_own'])} | "
                        f"{floor[f'{name}_rms_difference']:.4f} | {interval(floor[f'{name}_perturbed_diff_ci95'])} |"
                        for name, label in (("coordinates", f"{ARMS[FLOOR_BASE]['label']}, coordinate null basis"),
                                            ("eigh", f"{ARMS[FLOOR_BASE]['label']}, eigh's basis"),
                                            *[(name, variant_arm(variant)["label"])
                                              for name, (variant, _own) in FLOOR_VARIANTS.items()],
                                            ("heavyball_soap", "SOAP (heavyball), eigh's basis"),
                                            ("muon", "Muon"))],
                      "", f"The variants' own runs (seeds {', '.join(map(str, floor['seeds']))}) against SOAP-Muon's "
                      f"defaults (QR refreshes, eigh's basis, eps 1e-8; {floor['eigh_final_val_mean']:.4f}):", "",
                      "| variant | final val | paired 95% against the defaults |", "|---|---|---|",
                      *[f"| {variant} | {floor[f'{name}_final_val_mean']:.4f} | "
                        f"{interval(floor[f'{name}_minus_eigh_ci95'])} |"
                        for name, (variant, _own) in FLOOR_VARIANTS.items()]]
    return "\n".join(lines + [""])


def plot(out: Path, records: dict[str, dict[str, dict[int, dict]]]) -> None:
    """Per regime, the seed-mean validation curves of each base arm under both bases, from step 200."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(records), figsize=(6 * len(records), 4), squeeze=False)
    for ax, (regime, by_arm) in zip(axes[0], records.items()):
        for base, color in zip(BASES, ("C0", "C1", "C2")):
            for group, style in ((base, "--"), (COORDINATES[base], "-")):
                if all(s in by_arm.get(group, {}) for s in SEEDS):
                    steps, vals = zip(*[(s, v) for s, v in mean_curve([by_arm[group][s] for s in SEEDS]) if s >= 200])
                    basis = "coordinates" if group != base else "eigh"
                    ax.plot(steps, vals, style, color=color, label=f"{ARMS[base]['label']}, {basis}")
        if all(s in by_arm.get("muon", {}) for s in SEEDS):
            steps, vals = zip(*[(s, v) for s, v in mean_curve([by_arm["muon"][s] for s in SEEDS]) if s >= 200])
            ax.plot(steps, vals, ":", color="k", label="Muon")
        ax.set(xlabel="step", ylabel=f"validation loss (mean of {len(SEEDS)} seeds)",
               title=f"nanoGPT, {regime}: null basis eigh (dashed), coordinates (solid)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{NAME}.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = follow_up_args(__doc__.splitlines()[0], argv)
    chosen = {regime: tuned(regime) for regime in MEASURED}
    todo = {regime: jobs(chosen[regime], regime) for regime in MEASURED}
    seeds_cache = RunCache(RESULTS / "soap_seeds_runs.json")
    every = [job for regime in MEASURED for job in todo[regime]]
    found = runs_beside_the_campaign(sorted((job for job in every if job["key"] not in seeds_cache), key=priority),
                                     RunCache(args.out / f"{NAME}_runs.json"), args.workers, not args.report, NAME)
    found.update({job["key"]: seeds_cache[job["key"]] for job in every if job["key"] in seeds_cache})
    records = records_by_group(todo, found)
    first = [*first_update(2, first_update_pairs()), *first_update(6, first_update_pairs())]
    summaries = {regime: summarize(records[regime], chosen[regime], regime) for regime in MEASURED}
    n_runs = sum(len(runs) for by_arm in records.values() for runs in by_arm.values())
    md = markdown(summaries, first, n_runs)
    write_results(args.out, NAME, md, {"first_update": first, "regimes": summaries})
    plot(args.out, records)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
