"""benchmarks/nanogpt_matrix.py's schedule, run by a fake loss instead of training: the rate grid extends at an
edge (at most twice) so the chosen rate is inside it, weight decay is tuned at that rate, seeds run at the
chosen pair; the screen drops an arm by Muon's seed spread; --report replays a cache without training."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from benchmarks import nanogpt_matrix as nm


def fake_run(job: dict, optimum: float, wd_best: float = 0.05, floor: float = 1.5) -> dict:
    """A run whose final loss is smallest (floor) at lr = optimum and wd = wd_best; seeds add a small offset."""
    final = floor + math.log(job["lr"] / optimum) ** 2 + (job["wd"] - wd_best) ** 2 + 0.001 * job["seed"]
    return {"final_val": final, "evals": [[0, 4.0], [500, final + 0.1], [1000, final]], "wall_s": 1.0}


def drive(t: nm.Tuning, optimum: float, wd_best: float = 0.05, floor: float = 1.5) -> list[dict]:
    """Every job the tuning asks for, in order, answered by fake_run."""
    queue, jobs = list(t.first_jobs()), []
    while queue:
        job = queue.pop(0)
        jobs.append(job)
        queue += t.done(job, fake_run(job, optimum, wd_best, floor))
    return jobs


def test_an_inner_optimum_needs_no_extension_and_decay_then_seeds_follow():
    t = nm.Tuning("data_rich", nm.REGIMES["data_rich"], "muon", quick=False)
    jobs = drive(t, optimum=0.02)
    assert sorted(t.rates) == [0.01, 0.02, 0.04] and t.lr == 0.02
    assert sorted(t.decays) == list(nm.WEIGHT_DECAYS) and t.wd == 0.05
    assert t.finished() and sorted(t.runs) == [0, 1, 2]
    assert len(jobs) == 3 + 2 + 2 and len({j["key"] for j in jobs}) == len(jobs)


def test_an_edge_optimum_extends_the_grid_at_most_twice():
    once = nm.Tuning("data_rich", nm.REGIMES["data_rich"], "muon", quick=False)
    drive(once, optimum=0.07)
    assert 0.08 in once.rates and once.lr == 0.08 and once.lr < max(once.rates)  # inside after one extension
    far = nm.Tuning("data_rich", nm.REGIMES["data_rich"], "muon", quick=False)
    drive(far, optimum=10.0)
    assert sorted(far.rates) == [0.01, 0.02, 0.04, 0.08, 0.16] and far.lr == 0.16  # a bound, reported as such


def test_the_screen_drops_an_arm_beyond_two_muon_spreads_and_keeps_the_rest():
    tunings = {("screen", a): nm.Tuning("screen", nm.REGIMES["screen"], a, quick=False)
               for a in ("muon", "soap", "symo_published_gpt_true")}
    drive(tunings[("screen", "muon")], optimum=0.02)
    assert tunings[("screen", "muon")].finished() and len(tunings[("screen", "muon")].runs) == 3
    drive(tunings[("screen", "soap")], optimum=3e-3)  # its best equals Muon's seed-0 loss: kept
    published = tunings[("screen", "symo_published_gpt_true")]
    for job in published.first_jobs():  # a loss 0.5 above Muon's at every rate: dropped
        published.done(job, {**fake_run(job, 0.03), "final_val": fake_run(job, 0.03)["final_val"] + 0.5})
    dropped = nm.screened_out(tunings)
    assert list(dropped) == ["symo_published_gpt_true"]


def test_report_replays_the_cache_and_puts_unfinished_arms_in_a_progress_table(tmp_path, capsys):
    setup = nm.REGIMES["data_rich"]
    cache = {}
    for arm, optimum, floor in (("adamw", 4e-3, 1.7), ("muon", 0.02, 1.5)):
        t = nm.Tuning("data_rich", setup, arm, quick=False)
        for job in drive(t, optimum, floor=floor):
            cache[job["key"]] = {**fake_run(job, optimum, floor=floor), "arm": arm}
    half = nm.Tuning("data_rich", setup, "soap", quick=False)
    for job in half.first_jobs()[:2]:  # two of its three grid runs
        cache[job["key"]] = {**fake_run(job, 3e-3), "arm": "soap"}
    (tmp_path / "nanogpt_matrix_data_rich_runs.json").write_text(json.dumps(cache))
    assert nm.main(["--regime", "data_rich", "--arms", "adamw,muon,soap", "--report", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "nanogpt_matrix.json").read_text())
    assert set(data["data_rich"]["arms"]) == {"adamw", "muon"}
    assert data["data_rich"]["arms"]["muon"]["lr"] == 0.02 and data["data_rich"]["arms"]["muon"]["weight_decay"] == 0.05
    assert data["data_rich_progress"]["soap"]["stage"] == "rate grid, 2 of 3 runs"
    lo, hi = data["data_rich"]["arms"]["adamw"]["diff_to_muon_ci95"]
    assert lo > 0 and hi > 0  # the fake AdamW is worse than the fake Muon at every seed
    # Muon's seed-mean curve reaches its own mean final loss (at the last step; two of its seeds end above it)
    assert data["data_rich"]["arms"]["muon"]["steps_to_muon_final_ratio"] == 1.0
    assert data["data_rich"]["arms"]["adamw"]["steps_to_muon_final_ratio"] is None
    assert "--report" in (tmp_path / "nanogpt_matrix.md").read_text()


def test_an_arm_the_screen_drops_is_listed_under_the_reference_table_not_as_unfinished(tmp_path):
    cache = {}
    for regime, arm, optimum, floor in (("screen", "muon", 0.02, 1.8), ("screen", "symo_published_gpt_true", 0.03, 2.5),
                                        ("reference", "adamw", 4e-3, 1.7), ("reference", "muon", 0.02, 1.5)):
        t = nm.Tuning(regime, nm.REGIMES[regime], arm, quick=False)
        for job in drive(t, optimum, floor=floor):
            cache[job["key"]] = {**fake_run(job, optimum, floor=floor), "arm": arm}
    for regime in ("screen", "reference"):
        runs = {k: v for k, v in cache.items() if k.startswith(regime + "/")}
        (tmp_path / f"nanogpt_matrix_{regime}_runs.json").write_text(json.dumps(runs))
    arms = "adamw,muon,symo_published_gpt_true"
    assert nm.main(["--regime", "reference", "--arms", arms, "--report", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "nanogpt_matrix.json").read_text())
    assert set(data["reference"]["arms"]) == {"adamw", "muon"}
    assert list(data["reference"]["dropped_by_screen"]) == ["symo_published_gpt_true"]
    assert "reference_progress" not in data  # a dropped arm is not an unfinished one
    assert "dropped by the screening pass" in (tmp_path / "nanogpt_matrix.md").read_text()


def test_the_committed_tables_rebuild_from_the_committed_run_caches(tmp_path, monkeypatch):
    """`python -m benchmarks.nanogpt_matrix --report` on the committed caches: nothing trains or is timed, and the
    tables are the committed ones (arms still training show as in progress in both)."""
    results = Path(nm.__file__).parent / "results"
    for regime in nm.REGIMES:
        shutil.copy(results / f"nanogpt_matrix_{regime}_runs.json", tmp_path)

    def computed(*args, **kwargs):
        raise AssertionError("the committed cache lacks a run or a timing")

    monkeypatch.setattr(nm, "run_one", computed)
    monkeypatch.setattr(nm, "timing", computed)
    assert nm.main(["--report", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "nanogpt_matrix.md").read_text() == (results / "nanogpt_matrix.md").read_text()
