"""benchmarks/null_basis.py, without its training: the runs it reads from the campaign's and soap_seeds' caches,
the coordinate arms (one option changed), the perturbed floor runs, and its paired intervals against hand
computation."""

from __future__ import annotations

import math
import statistics

from benchmarks import null_basis
from benchmarks.nanogpt_matrix_runs import ARMS, REGIMES, job_for
from benchmarks.null_basis import (
    BASES,
    COORDINATES,
    EIGH_FLOOR_KEY,
    FLOOR_KEY,
    FLOOR_SEEDS,
    FLOOR_VARIANTS,
    MUON_FLOOR_KEY,
    SEEDS,
    coordinate_arm,
    jobs,
    summarize,
    variant_arm,
)

ARMS_READ = ("muon", "soap", *BASES)
CHOSEN = {arm: {"lr": 0.01 * (i + 1), "weight_decay": 0.05} for i, arm in enumerate(ARMS_READ)}


def test_each_coordinate_arm_changes_one_option_and_the_other_runs_keep_their_keys() -> None:
    for base in BASES:
        arm = coordinate_arm(base)
        assert arm["options"] == {**ARMS[base]["options"], "null_basis": "coordinates"}
        assert "null_basis" not in ARMS[base]["options"]
    planned = jobs(CHOSEN, "reference")
    assert len(planned) == (len(BASES) * len(SEEDS) * 2 + (3 + 2 * len(FLOOR_VARIANTS)) * len(FLOOR_SEEDS)
                            + 2 * len(SEEDS))
    assert len({job["key"] for job in planned}) == len(planned)
    setup = REGIMES["reference"]
    for arm in ARMS_READ:  # the campaign's and soap_seeds' own keys, so that their runs are read, not retrained
        keys = {job["key"] for job in planned if job["group"] == arm}
        assert keys == {job_for("reference", setup, arm, CHOSEN[arm]["lr"], 0.05, s)["key"] for s in SEEDS}
        assert all("arm_config" not in job for job in planned if job["group"] == arm)
    for base in BASES:
        mine = [job for job in planned if job["group"] == COORDINATES[base]]
        assert [job["lr"] for job in mine] == [CHOSEN[base]["lr"]] * len(SEEDS)
        assert all(job["arm_config"]["options"]["null_basis"] == "coordinates" for job in mine)
    for key, arm in ((FLOOR_KEY, coordinate_arm(BASES[0])), (EIGH_FLOOR_KEY, ARMS[BASES[0]]),
                     (MUON_FLOOR_KEY, ARMS["muon"]),
                     *[(f"{own}_init_perturbed", variant_arm(v)) for v, own in FLOOR_VARIANTS.values()]):
        floor = [job for job in planned if job["group"] == key]
        assert [job["seed"] for job in floor] == list(FLOOR_SEEDS)
        assert all(job["init_perturbation"] == null_basis.PERTURBATION and job["arm_config"] == arm for job in floor)
        assert not [job for job in jobs(CHOSEN, "data_rich") if job["group"] == key]
    # each floor variant: SOAP-Muon with the coordinate basis and one more option, and its own unperturbed runs
    refresh, eps = (variant_arm(v)["options"] for v, _own in FLOOR_VARIANTS.values())
    assert type(refresh.pop("refresh")).__name__ == "Eigh" and eps.pop("eps") == 1e-5
    assert refresh == eps == coordinate_arm(BASES[0])["options"]
    # the eigh-refresh runs keep the keys they were trained under
    assert FLOOR_VARIANTS["eigh_refresh"][1] == "symo_soap_muon_gpt_muon_null_coordinates_eigh_refresh"
    for _variant, group in FLOOR_VARIANTS.values():
        own = [job for job in planned if job["group"] == group]
        assert [job["seed"] for job in own] == list(FLOOR_SEEDS)
        assert all("init_perturbation" not in job for job in own)


def test_the_first_update_pairs_are_each_arm_under_both_bases_then_soap_muon_variants() -> None:
    pairs = null_basis.first_update_pairs()
    assert [(p["arm_a"], p["basis"]) for p in pairs[:2 * len(BASES)]] == \
        [(base, basis) for base in BASES for basis in ("eigh", "coordinates")]
    variants = pairs[2 * len(BASES):]
    assert [p["variant"] for p in variants] == list(null_basis.FIRST_UPDATE_VARIANTS)
    for p in variants:
        changed = null_basis.FIRST_UPDATE_VARIANTS[p["variant"]]
        assert p["config_a"] == p["config_b"] and p["perturbed"]
        assert p["config_a"]["options"] == {**ARMS[BASES[0]]["options"], **changed}
        assert p["basis"] == changed.get("null_basis", "eigh")


def _records(finals: dict[str, list[float]]) -> dict[str, dict[int, dict]]:
    return {group: {s: {"seed": s, "final_val": f, "evals": [(0, 3.0), (500, f + 0.1), (1000, f)]}
                    for s, f in zip(SEEDS, values)} for group, values in finals.items()}


def _t_interval(d: list[float]) -> list[float]:
    half = {5: 2.5705818366147395}[len(d) - 1] * statistics.stdev(d) / math.sqrt(len(d))
    return [statistics.mean(d) - half, statistics.mean(d) + half]


def test_coordinates_are_paired_with_eigh_muon_and_heavyball_seed_by_seed() -> None:
    finals = {"muon": [1.55, 1.54, 1.56, 1.55, 1.545, 1.555], "soap": [1.52, 1.52, 1.53, 1.52, 1.525, 1.53]}
    for i, base in enumerate(BASES):
        finals[base] = [1.53 + 0.001 * i, 1.52, 1.54, 1.52, 1.52, 1.53]
        finals[COORDINATES[base]] = [1.51, 1.525, 1.52, 1.515, 1.53, 1.52 - 0.002 * i]
    out = summarize(_records(finals), CHOSEN, "data_rich")
    assert out["floor"] is None
    for base in BASES:
        entry = out["arms"][base]
        coords, eigh = finals[COORDINATES[base]], finals[base]
        expected = _t_interval([c - e for c, e in zip(coords, eigh)])
        assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(entry["coordinates_minus_eigh_ci95"], expected))
        muon = _t_interval([c - m for c, m in zip(coords, finals["muon"])])
        assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(entry["coordinates"]["diff_to_muon_ci95"], muon))
        assert math.isclose(entry["coordinates"]["final_val_mean"], statistics.mean(coords))
    # an arm short of a seed under either basis is left out, not summarized on fewer seeds
    del finals[COORDINATES[BASES[0]]]
    assert BASES[0] not in summarize(_records(finals), CHOSEN, "data_rich")["arms"]


def test_the_report_names_every_arm_and_basis() -> None:
    finals = {"muon": [1.55] * 6, "soap": [1.52, 1.52, 1.53, 1.52, 1.525, 1.53]}
    for base in BASES:
        finals[base] = [1.53, 1.52, 1.54, 1.52, 1.52, 1.531]
        finals[COORDINATES[base]] = [1.51, 1.525, 1.52, 1.515, 1.53, 1.52]
    summary = summarize(_records(finals), CHOSEN, "data_rich")
    first = [{"pair": "p", "arm_a": base, "arm_b": base, "basis": basis, "steps": steps, "perturbed": True,
              "relative_difference": 0.5} for base in BASES for basis in ("eigh", "coordinates") for steps in (2, 6)]
    md = null_basis.markdown({"data_rich": summary}, first, 42)
    for base in BASES:
        assert md.count(f"| {ARMS[base]['label']} |") == 4  # two first-update rows, two result rows
    assert "42 runs" in md and "5.00e-01" in md


def test_the_floor_pairs_each_perturbed_run_with_its_own_unperturbed_run() -> None:
    finals = {"muon": [1.55, 1.54, 1.56, 1.55, 1.545, 1.555], "soap": [1.52] * 6,
              MUON_FLOOR_KEY: [1.552, 1.541, 1.559], FLOOR_KEY: [1.52, 1.515, 1.53],
              EIGH_FLOOR_KEY: [1.53, 1.54, 1.52]}
    for _variant, own in FLOOR_VARIANTS.values():
        finals[own], finals[f"{own}_init_perturbed"] = [1.525, 1.52, 1.535], [1.526, 1.52, 1.53]
    for base in BASES:
        finals[base] = [1.53] * 6
        finals[COORDINATES[base]] = [1.51, 1.525, 1.52, 1.515, 1.53, 1.52]
    floor = summarize(_records(finals), CHOSEN, "reference")["floor"]
    muon = [1.552 - 1.55, 1.541 - 1.54, 1.559 - 1.56]
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(floor["muon_perturbed_minus_own"], muon))
    assert math.isclose(floor["muon_rms_difference"], math.sqrt(sum(d * d for d in muon) / 3))
    coords = [1.52 - 1.51, 1.515 - 1.525, 1.53 - 1.52]
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(floor["coordinates_perturbed_minus_own"], coords))
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(floor["eigh_perturbed_minus_own"], [0, 0.01, -0.01]))
    refresh = [1.526 - 1.525, 0.0, 1.53 - 1.535]
    for name in FLOOR_VARIANTS:
        assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(floor[f"{name}_perturbed_minus_own"], refresh))
        assert math.isclose(floor[f"{name}_final_val_mean"], statistics.mean([1.525, 1.52, 1.535]))
    expected = [a - b for a, b in zip([1.525, 1.52, 1.535], [1.53] * 3)]
    half = 4.302652729911275 * statistics.stdev(expected) / math.sqrt(3)  # t(0.975, 2)
    assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in
               zip(floor["eigh_refresh_minus_eigh_ci95"], [statistics.mean(expected) - half,
                                                            statistics.mean(expected) + half]))
    assert floor["heavyball_soap_perturbed_minus_own"]  # soap_seeds' measured floor, read from its report
    md = null_basis.markdown({"reference": {"arms": {}, "floor": floor}}, [], 3)
    assert "| Muon |" in md
    for variant, _own in FLOOR_VARIANTS.values():  # a floor row, and a row against the defaults
        assert f"| {variant_arm(variant)['label']} | +0.0010, " in md and f"| {variant} | 1.5267 | " in md
