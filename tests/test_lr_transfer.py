"""benchmarks/lr_transfer.py: the grid rule (extension at an edge, at most twice, bounds), the recommended
rate, the nanoGPT cells read from other results or marked pending, the preset arms, and --quick end to end
with a second invocation that trains nothing."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import lr_transfer as lt
from benchmarks.preset_arms import arm_name, preset_options


def tune(optimum: float, centre: float) -> lt.Cell:
    """A cell tuned on a smooth loss with its minimum at `optimum`, as run_cells does it."""
    cell = lt.Cell("muon", None, "fake")
    cell.todo = lt.first_grid(centre)
    while cell.todo:
        for lr in cell.todo:
            cell.record(lr, math.log(lr / optimum) ** 2, 1.0)
        cell.advance()
    return cell


def test_an_edge_optimum_extends_the_grid_and_an_inner_one_does_not():
    inner = tune(0.1, 0.1)
    assert sorted(inner.finals) == [0.0333, 0.1, 0.3] and inner.best == 0.1 and inner.bound == ""
    once = tune(0.9, 0.1)
    assert sorted(once.finals) == [0.0333, 0.1, 0.3, 0.9, 2.7] and once.best == 0.9 and once.bound == ""
    low = tune(0.004, 0.1)
    assert sorted(low.finals) == [0.0037, 0.0111, 0.0333, 0.1, 0.3] and low.best == 0.0037
    assert low.extensions == 2 and low.bound == "<="  # still at the edge: the optimum may lie below
    assert tune(100.0, 0.1).bound == ">="


def test_diverged_rates_lose_and_ties_take_the_smaller_rate():
    assert lt.best_of({0.1: math.inf, 0.03: 2.0, 0.01: 2.0}) == 0.01
    assert lt.extension({0.1: math.inf, 0.3: math.inf, 0.03: 1.0}) == 0.01


def test_recommendation_minimises_the_worst_ratio(monkeypatch):
    assert lt.recommend([0.01, 0.09]) == 0.03  # geometric midpoint: 3x either way
    assert lt.recommend([0.02]) == 0.02
    assert [lt.nice(x) for x in (0.017, 0.0042, 0.6, 1.2)] == [0.015, 0.005, 0.7, 1.0]
    cells = {("p", None, q): lt.Cell("p", None, q, finals={lr / 3: 1.0, lr: 0.0, lr * 3: 1.0})
             for q, lr in (("a", 0.01), ("b", 0.09))}
    monkeypatch.setitem(lt.GRID_CENTRE, "p", 0.03)
    out = lt.summarise(cells, ["p"], ["a", "b"], {"p": 0.03})
    assert out["presets"]["p"]["recommended"] == 0.03
    assert out["presets"]["p"]["worst_ratio_at_recommended"] == pytest.approx(3.0)
    assert out["goal_met"] and out["cells_within_goal"] == 2


def test_nanogpt_cells_come_from_the_results_files_or_are_pending(tmp_path):
    assert lt.nanogpt_cell("eigen_adam", tmp_path).source.startswith("pending: nanogpt_matrix.json")
    (tmp_path / "nanogpt_matrix.json").write_text(json.dumps({"screen": {"arms": {
        "symo_eigen_adam_gpt_muon": {"lr": 0.003, "grid": {"0.0015": 1.7, "0.003": 1.6, "0.006": 1.65}}}}}))
    cell = lt.nanogpt_cell("eigen_adam", tmp_path)
    assert cell.best == 0.003 and cell.bound == "" and "screen (small size)" in cell.source
    # before Muon's screen has finished: an arm whose grid has finished counts, one still tuning does not
    (tmp_path / "nanogpt_matrix.json").write_text(json.dumps({"screen_progress": {
        "symo_published_gpt_muon": {"stage": "finished at lr 0.03, wd 0 (1 seed)",
                                    "grid": {"0.015": 2.2, "0.03": 2.1, "0.06": 3.2}},
        "symo_eigen_adam_gpt_muon": {"stage": "rate grid, 1 of 3 runs", "grid": {"0.0015": 2.4}}}}))
    assert lt.nanogpt_cell("published", tmp_path).best == 0.03
    assert lt.nanogpt_cell("eigen_adam", tmp_path).source.startswith("pending")
    (tmp_path / "nanogpt_compare.json").write_text(json.dumps({"optimizers": {
        "muon": {"lr": 0.02, "grid": {"0.01": 1.85, "0.02": 1.81, "0.04": 1.88}}}}))
    assert lt.nanogpt_cell("muon", tmp_path).best == 0.02


def test_preset_arms_name_a_preset_and_optionally_its_scale():
    assert preset_options(arm_name("shampoo")) == {"preset": "shampoo"}
    assert preset_options(arm_name("published", "adamw")) == {"preset": "published", "update_scale": "adamw"}
    assert preset_options("symo_notebook") is None
    with pytest.raises(ValueError, match="unknown preset"):
        preset_options("preset_nonesuch")
    assert "muon" not in lt.accepted_scales("published") and lt.accepted_scales("muon") == ["adamw"]


def test_quick_mode_writes_the_outputs_and_a_second_run_trains_nothing(tmp_path, one_thread):
    lt.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "lr_transfer.json").read_text())
    assert set(data["presets"]) == {"muon", "notebook"}
    for t in data["presets"].values():
        assert set(t["cells"]) == {"paper_mlp tanh", "rnn_train"}
        assert all(len(c["grid"]) == 2 and c["best_lr"] > 0 for c in t["cells"].values())
    caches = {n: (tmp_path / n).read_text() for n in ("lr_transfer_runs.json", "rnn_train_runs.json")}
    md = (tmp_path / "lr_transfer.md").read_text()
    assert md.splitlines()[2].startswith("Command: `python -m benchmarks.lr_transfer --quick`")
    lt.main(["--quick", "--out", str(tmp_path)])
    assert {n: (tmp_path / n).read_text() for n in caches} == caches


def test_a_grid_step_rounded_to_three_digits_counts_as_three_and_four_does_not():
    """0.00333 is one factor-3 step below 0.01 on the grid (rates keep 3 significant digits): within 3x."""
    assert lt.grid_rate(0.01 / 3) == 0.00333
    assert lt.within_goal({"bound": "", "ratio": 0.00333 / 0.01})
    assert lt.within_goal({"bound": "", "ratio": 0.0301 / 0.01})
    assert not lt.within_goal({"bound": "", "ratio": 0.0025 / 0.01})
    assert not lt.within_goal({"bound": "<=", "ratio": 1.0})
