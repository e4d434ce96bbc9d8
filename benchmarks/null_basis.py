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
- floor (reference regime): SOAP-Muon with the coordinate basis at seeds 0-2 from initial weights moved by 1e-7,
  paired with its own unperturbed runs, beside the same measured for heavyball's SOAP in soap_seeds.

    python -m benchmarks.null_basis              # 39 runs of 1-7 minutes on 2 workers
    python -m benchmarks.null_basis --report     # train nothing: the report of what the run caches hold

New runs go to benchmarks/results/null_basis_runs.json. Writes null_basis.{md,json,png}.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from benchmarks.harness import RunCache, mean_std, paired_diff_ci95, write_results
from benchmarks.nanogpt_matrix_runs import (
    ARMS,
    REGIMES,
    RESULTS,
    build,
    follow_up_args,
    job_for,
    perturb,
    runs_beside_the_campaign,
)
from benchmarks.soap_seeds import muon_loss_steps_ratio, tuned

NAME = "null_basis"
MEASURED = ("reference", "data_rich")
FLOOR_REGIME = "reference"
SEEDS, FLOOR_SEEDS = (0, 1, 2, 3, 4, 5), (0, 1, 2)
PERTURBATION = 1e-7
BASES = ("symo_soap_muon_gpt_muon", "symo_soap_heavyball_gpt_muon", "symo_soap_gpt_muon")
COORDINATES = {base: f"{base}_null_coordinates" for base in BASES}
FLOOR_BASE = "symo_soap_muon_gpt_muon"
FLOOR_KEY = f"{COORDINATES[FLOOR_BASE]}_init_perturbed"


def coordinate_arm(base: str) -> dict[str, Any]:
    """The campaign arm `base` with null_basis="coordinates" and nothing else changed."""
    arm = ARMS[base]
    return {**arm, "options": {**arm["options"], "null_basis": "coordinates"},
            "label": f"{arm['label']}, coordinate null basis"}


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
        lr, wd = chosen[FLOOR_BASE]["lr"], chosen[FLOOR_BASE]["weight_decay"]
        for seed in FLOOR_SEEDS:
            job = job_for(regime, setup, FLOOR_KEY, lr, wd, seed)
            out.append(dict(job, group=FLOOR_KEY, arm_config=coordinate_arm(FLOOR_BASE),
                            init_perturbation=PERTURBATION))
    for arm in ("muon", "soap", *BASES):
        lr, wd = chosen[arm]["lr"], chosen[arm]["weight_decay"]
        out += [dict(job_for(regime, setup, arm, lr, wd, seed), group=arm) for seed in SEEDS]
    return out


def main(argv: list[str] | None = None) -> int:
    args = follow_up_args(__doc__.splitlines()[0], argv)
    chosen = {regime: tuned(regime) for regime in MEASURED}
    todo = [job for regime in MEASURED for job in jobs(chosen[regime], regime)]
    seeds_cache = RunCache(RESULTS / "soap_seeds_runs.json")
    new = [job for job in todo if job["key"] not in seeds_cache]
    found = runs_beside_the_campaign(new, RunCache(args.out / f"{NAME}_runs.json"), args.workers, not args.report,
                                     NAME)
    found.update({job["key"]: seeds_cache.get(job["key"]) for job in todo if job["key"] in seeds_cache})
    print(len(found), "runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
