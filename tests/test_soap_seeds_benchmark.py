"""benchmarks/soap_seeds.py, without its training: which runs it reuses from the campaign's cache, the perturbed
floor runs, its paired intervals and step ratios against hand computation, and the initial-weight perturbation."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from benchmarks import soap_seeds
from benchmarks.nanogpt_matrix_runs import QUICK, job_for, perturb, run_one
from benchmarks.soap_seeds import (
    CAMPAIGN_SEEDS,
    EXTENDED,
    EXTRA_SEEDS,
    FLOOR_KEY,
    PERTURBATION,
    SYMMETRY_PAIRS,
    jobs,
    summarize,
)

CHOSEN = {arm: {"lr": 0.01 * (i + 1), "weight_decay": 0.05} for i, arm in enumerate(EXTENDED)}


def test_campaign_seeds_carry_the_campaign_keys_and_the_floor_carries_its_perturbation() -> None:
    from benchmarks.nanogpt_matrix_runs import ARMS, REGIMES

    planned = jobs(CHOSEN, "reference")
    seeds = CAMPAIGN_SEEDS + EXTRA_SEEDS
    assert len(planned) == len(EXTENDED) * len(seeds) + len(CAMPAIGN_SEEDS)
    for arm in EXTENDED:  # the campaign's own keys, so that its cached runs are read rather than retrained
        keys = {job["key"] for job in planned if job["group"] == arm}
        regime = "reference"
        assert keys == {job_for(regime, REGIMES[regime], arm, CHOSEN[arm]["lr"], 0.05, s)["key"] for s in seeds}
    floor = [job for job in planned if job["group"] == FLOOR_KEY]
    assert [job["seed"] for job in floor] == list(CAMPAIGN_SEEDS)
    assert all(job["arm_config"] is ARMS[soap_seeds.FLOOR_ARM] and job["init_perturbation"] == PERTURBATION and
               job["lr"] == CHOSEN[soap_seeds.FLOOR_ARM]["lr"] for job in floor)
    assert len({job["key"] for job in planned}) == len(planned)
    rich = jobs(CHOSEN, "data_rich")  # the floor is measured in the reference regime only
    assert len(rich) == len(EXTENDED) * len(seeds) and all(job["key"].startswith("data_rich/") for job in rich)


def _run(seed: int, final: float, mid: float) -> dict:
    return {"seed": seed, "final_val": final, "evals": [(0, 3.0), (500, mid), (1000, final)]}


def _records(finals: dict[str, list[float]], mids: dict[str, float]) -> dict[str, dict[int, dict]]:
    return {group: {s: _run(s, f, mids[group]) for s, f in zip(CAMPAIGN_SEEDS + EXTRA_SEEDS, values)}
            for group, values in finals.items()}


def _t_interval(d: list[float]) -> list[float]:
    half = {2: 4.302652729911275, 5: 2.5705818366147395}[len(d) - 1] * statistics.stdev(d) / math.sqrt(len(d))
    return [statistics.mean(d) - half, statistics.mean(d) + half]


def test_three_and_six_seeds_are_paired_with_muon_and_heavyballs_soap_seed_by_seed() -> None:
    finals = {"muon": [1.55, 1.54, 1.56, 1.55, 1.545, 1.555], "soap": [1.52, 1.52, 1.53, 1.52, 1.525, 1.53],
              "symo_soap_heavyball_gpt_muon": [1.53, 1.52, 1.54, 1.52, 1.52, 1.53],
              "symo_soap_muon_gpt_muon": [1.52, 1.53, 1.525, 1.56, 1.55, 1.56]}
    mids = {"muon": 1.6, "soap": 1.54, "symo_soap_heavyball_gpt_muon": 1.56, "symo_soap_muon_gpt_muon": 1.545}
    for arm in EXTENDED:  # the arms this test does not look at
        finals.setdefault(arm, [1.6] * 6)
        mids.setdefault(arm, 1.7)
    out = summarize(_records(finals, mids), CHOSEN)
    for arm in ("muon", "soap", "symo_soap_heavyball_gpt_muon", "symo_soap_muon_gpt_muon"):
        for n in (3, 6):
            e = out["arms"][arm][f"seeds_{n}"]
            assert e["final_val_mean"] == pytest.approx(statistics.mean(finals[arm][:n]))
            if arm != "muon":
                d = [a - b for a, b in zip(finals[arm][:n], finals["muon"][:n])]
                assert e["diff_to_muon_ci95"] == pytest.approx(_t_interval(d))
            if arm != "soap":
                d = [a - b for a, b in zip(finals[arm][:n], finals["soap"][:n])]
                assert e["diff_to_heavyball_soap_ci95"] == pytest.approx(_t_interval(d))
    # Muon's 3-seed mean is 1.55: its own curve reaches it at step 1000, SOAP's by step 500
    assert out["arms"]["soap"]["seeds_3"]["muon_loss_steps_ratio"] == 0.5
    # over 6 seeds Muon's mean is 1.55 again, and SOAP-Muon's seed-mean curve is at 1.545 by step 500
    assert out["arms"]["symo_soap_muon_gpt_muon"]["seeds_6"]["steps_to_muon_final"] == 500
    assert out["floor"] is None  # no perturbed runs yet
    # the 20 three-seed subsets: every subset's Muon mean is at least 1.545, which SOAP's seed-mean curve is under
    # by step 500 and Muon's own reaches at step 1000
    soap_ratios = out["arms"]["soap"]["subset_ratios"]
    assert len(soap_ratios) == 20 and set(soap_ratios) == {0.5} and "subset_ratios" not in out["arms"]["muon"]
    md = soap_seeds.markdown({"reference": out}, [{"pair": "a against b", "relative_difference": 0.5}], 24)
    assert "| a against b | 5.00e-01 |" in md and "| SOAP (heavyball) | 0.02 | 0.05 | 6 |" in md
    assert "The floor" not in md and "| SOAP (heavyball) | 0.50x | 0.50x to 0.50x | 20 of 20 |" in md


def test_the_floor_pairs_the_perturbed_runs_and_soap_heavyball_with_the_campaign_runs() -> None:
    finals = {arm: [1.5 + 0.01 * i] * 6 for i, arm in enumerate(EXTENDED)}
    records = _records(finals, {arm: 1.6 for arm in EXTENDED})
    records["symo_soap_heavyball_gpt_muon"] = {s: _run(s, f, 1.6) for s, f in zip(CAMPAIGN_SEEDS, [1.52, 1.53, 1.51])}
    records[FLOOR_KEY] = {s: _run(s, f, 1.6) for s, f in zip(CAMPAIGN_SEEDS, [1.512, 1.509, 1.515])}
    out = summarize(records, CHOSEN)
    floor = out["floor"]
    assert floor["perturbed_minus_heavyball"] == pytest.approx([0.002, -0.001, 0.005])
    assert floor["perturbed_diff_ci95"] == pytest.approx(_t_interval([0.002, -0.001, 0.005]))
    assert floor["soap_heavyball_minus_heavyball"] == pytest.approx([0.01, 0.02, 0.0])
    assert set(out["arms"]["soap"]) == {"label", "lr", "weight_decay", "seeds_3"}  # soap_heavyball has 3 seeds
    md = soap_seeds.markdown({"reference": out}, [], 15)
    assert "| heavyball's SOAP, perturbed | +0.0020, -0.0010, +0.0050 |" in md


def test_each_kind_on_the_true_symmetry_is_paired_with_itself_on_the_muon_style_spec() -> None:
    finals = {arm: [1.55] * 6 for arm in EXTENDED}
    finals["symo_soap_gpt_true"] = [1.56, 1.55, 1.57, 1.56, 1.565, 1.555]
    finals["symo_soap_gpt_muon"] = [1.55, 1.545, 1.55, 1.56, 1.55, 1.55]
    out = summarize(_records(finals, {arm: 1.6 for arm in EXTENDED}), CHOSEN)
    pairs = {pair["kind"]: pair for pair in out["symmetry"]}
    assert set(pairs) == {kind for kind, _, _ in SYMMETRY_PAIRS} == {"soap", "SOAP-Muon"}
    d = [a - b for a, b in zip(finals["symo_soap_gpt_true"], finals["symo_soap_gpt_muon"])]
    assert pairs["soap"]["true_minus_muon_style_ci95"] == pytest.approx(_t_interval(d))
    assert pairs["SOAP-Muon"]["true_minus_muon_style_ci95"] == pytest.approx([0.0, 0.0])
    md = soap_seeds.markdown({"data_rich": out}, [], 48)
    assert "## data_rich: does the true symmetry help SOAP" in md
    true, muon_style = finals["symo_soap_gpt_true"], finals["symo_soap_gpt_muon"]
    row = "| soap | {:.4f} ± {:.4f} | {:.4f} ± {:.4f} | [{:+.4f}, {:+.4f}] |".format(
        statistics.mean(true), statistics.stdev(true), statistics.mean(muon_style), statistics.stdev(muon_style),
        *_t_interval(d))
    assert row in md
    del finals["symo_soap_muon_gpt_true"][5]  # five seeds: no pair for SOAP-Muon, and no six-seed table at all
    out = summarize(_records(finals, {arm: 1.6 for arm in EXTENDED}), CHOSEN)
    assert [pair["kind"] for pair in out["symmetry"]] == ["soap"]


def test_the_perturbation_is_relative_seeded_and_changes_a_run_by_little() -> None:
    a, b, c = (torch.nn.Linear(64, 64) for _ in range(3))
    b.load_state_dict(a.state_dict())
    c.load_state_dict(a.state_dict())
    perturb(b, 1e-3, seed=0)
    perturb(c, 1e-3, seed=0)
    rel = (b.weight - a.weight).detach().abs() / a.weight.detach().abs()
    assert torch.equal(b.weight, c.weight) and 2e-4 < float(rel.mean()) < 2e-3
    job = job_for("quick", QUICK, "muon", 0.02, 0.0, seed=0)
    plain = run_one(job)
    moved = run_one(dict(job, init_perturbation=1e-3))  # at 1e-7 a 10-step Muon run's loss does not move in float32
    assert plain["final_val"] != moved["final_val"] and abs(plain["final_val"] - moved["final_val"]) < 1e-2
