"""benchmarks/lr_transfer.py: the grid rule (extension at an edge, at most twice, bounds), the recommended rate, the
nanoGPT cells read from other results (gpt_muon and gpt_true arms) or marked pending, the nanoGPT runs trained here
(their keys and spec, parameter_rms on), the preset arms (on either spec variant), the two spec columns (which
presets and cells each measures, the cache-key suffixes of changed code, what each spec leaves to AdamW, the
per-spec goal and tables), and --quick end to end with a second invocation that trains nothing."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import lr_transfer as lt
from benchmarks import lr_transfer_grid as ltg
from benchmarks import lr_transfer_report as ltr
from benchmarks.preset_arms import arm_name, preset_options, preset_spec


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
    assert ltg.best_of({0.1: math.inf, 0.03: 2.0, 0.01: 2.0}) == 0.01
    assert ltg.extension({0.1: math.inf, 0.3: math.inf, 0.03: 1.0}) == 0.01


def test_recommendation_minimises_the_worst_ratio(monkeypatch):
    assert ltg.recommend([0.01, 0.09]) == 0.03  # geometric midpoint: 3x either way
    assert ltg.recommend([0.02]) == 0.02
    assert [ltg.nice(x) for x in (0.017, 0.0042, 0.6, 1.2)] == [0.015, 0.005, 0.7, 1.0]
    cells = {("p", None, q): lt.Cell("p", None, q, finals={lr / 3: 1.0, lr: 0.0, lr * 3: 1.0})
             for q, lr in (("a", 0.01), ("b", 0.09))}
    monkeypatch.setitem(lt.GRID_CENTRE, "p", 0.03)
    out = ltr.summarise(cells, ["p"], ["a", "b"], {"p": 0.03})
    assert out["presets"]["p"]["recommended"] == 0.03
    assert out["presets"]["p"]["worst_ratio_at_recommended"] == pytest.approx(3.0)
    assert out["goal_met"] and out["cells_within_goal"] == 2


def test_nanogpt_cells_come_from_the_results_files_or_are_pending(tmp_path):
    assert lt.nanogpt_cell("eigen_adam", tmp_path).source.startswith("pending: nanogpt_matrix.json")
    # eigen_adam as the preset is now: nanogpt_matrix's one_sided_soap arm, not its eigen_adam arm (older conventions)
    (tmp_path / "nanogpt_matrix.json").write_text(json.dumps({"screen": {"arms": {
        "symo_eigen_adam_gpt_muon": {"lr": 0.006, "grid": {"0.003": 1.7, "0.006": 1.6, "0.012": 1.65}},
        "symo_one_sided_soap_gpt_muon": {"lr": 0.003, "grid": {"0.0015": 1.7, "0.003": 1.6, "0.006": 1.65}}}}}))
    cell = lt.nanogpt_cell("eigen_adam", tmp_path)
    assert cell.best == 0.003 and cell.bound == "" and "screen (small size)" in cell.source
    assert "symo_one_sided_soap_gpt_muon" in cell.source and cell.spec == "muon"
    assert lt.nanogpt_cell("soap", tmp_path).source.startswith("pending")
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


def test_the_nanogpt_true_column_reads_the_campaigns_gpt_true_arms_that_are_the_presets_now(tmp_path):
    """published, eigen_adam and soap: nanogpt_matrix's screening-pass gpt_true arms, whose options are the preset
    (published's refresh every 10 steps said in the source); not its gpt_true arms under Muon's scale, which ran
    with parameter_rms=False: muon and then_orthogonalize are trained here."""
    from benchmarks.nanogpt_matrix_runs import ARMS, REGIMES

    arms = {"published": "symo_published_gpt_true", "eigen_adam": "symo_one_sided_soap_gpt_true",
            "soap": "symo_soap_gpt_true"}
    assert {p: lt.NANOGPT_SOURCES["true"][p][2] for p in lt.NANOGPT_SOURCES["true"]} == arms
    for preset, arm in arms.items():
        assert ARMS[arm]["spec"] == "gpt_true"
        extra = {"precondition_frequency": 10} if preset == "published" else {}
        assert ARMS[arm]["options"] == {"preset": preset, **extra}, arm
        assert lt.NANOGPT_SOURCES["true"][preset][1] == "screen"
    assert all(ARMS[a]["options"].get("parameter_rms") is False
               for a in ("symo_defaults_gpt_true", "symo_then_orthogonalize_gpt_true", "symo_soap_muon_gpt_true"))
    assert {"muon", "then_orthogonalize"} <= set(lt.NANOGPT_TRAINED["true"])
    screen = REGIMES["screen"]  # the campaign's screening pass is nanogpt_compare's small size
    from benchmarks.nanogpt_compare import SETUP
    assert {k: screen[k] for k in SETUP} == SETUP
    (tmp_path / "nanogpt_matrix.json").write_text(json.dumps({"screen": {"arms": {
        "symo_soap_gpt_muon": {"lr": 0.012, "grid": {"0.006": 1.7, "0.012": 1.6, "0.024": 1.65}},
        "symo_soap_gpt_true": {"lr": 0.006, "grid": {"0.003": 1.9, "0.006": 1.8, "0.012": 1.85}}}}}))
    true, muon = lt.nanogpt_cell("soap", tmp_path, "true"), lt.nanogpt_cell("soap", tmp_path)
    assert (true.best, true.spec, muon.best, muon.spec) == (0.006, "true", 0.012, "muon")
    assert "symo_soap_gpt_true" in true.source and "symo_soap_gpt_muon" in muon.source
    assert lt.nanogpt_cell("eigen_adam", tmp_path, "true").source == \
        "pending: nanogpt_matrix.json (symo_one_sided_soap_gpt_true)"


def test_the_nanogpt_muon_column_reads_soap_muon_from_the_campaigns_arm_that_is_the_preset():
    """symo train's default preset on gpt_muon: the screening pass's SOAP-Muon arm, whose options build the preset's
    configuration (tests/test_presets.py); on gpt_true that arm ran with parameter_rms=False, so it is trained here."""
    from benchmarks.nanogpt_matrix_runs import ARMS, SOAP_MUON

    file, regime, arm, differs = lt.NANOGPT_SOURCES["muon"]["soap_muon"]
    assert (file, regime, arm, differs) == ("nanogpt_matrix.json", "screen", "symo_soap_muon_gpt_muon", "")
    assert ARMS[arm]["options"] == SOAP_MUON and ARMS[arm]["spec"] == "gpt_muon"
    assert "soap_muon" in lt.NANOGPT_TRAINED["true"] and "soap_muon" not in lt.NANOGPT_SOURCES["true"]
    cell = lt.nanogpt_cell("soap_muon", lt.RESULTS)  # the committed screening pass
    assert cell.best == 0.02 and cell.bound == ""


def test_nanogpt_runs_trained_here_take_their_columns_spec_with_parameter_rms_on(one_thread):
    """A gpt_muon run keeps its key (the cached shampoo runs are reused), a gpt_true run's key ends in /gpt_true;
    symo train builds the muon preset on gpt_true with today's default, parameter_rms on."""
    from benchmarks.nanogpt_compare import QUICK_SETUP, SETUP
    from symo.train import TrainConfig
    from symo.train.models import GPT, GPTConfig
    from symo.train.optimizers import build_optimizer

    muon = lt.nanogpt_job("preset_shampoo", 0.05, "muon", dict(SETUP), "/tmp/x")
    true = lt.nanogpt_job("preset_shampoo", 0.05, "true", dict(SETUP), "/tmp/x")
    assert muon["key"] == "nanogpt/preset_shampoo/lr0.05/seed0/4x128x4x16x64x500"
    assert true["key"] == muon["key"] + "/gpt_true"
    assert (muon["config"]["spec"], true["config"]["spec"]) == ("gpt_muon", "gpt_true")
    assert true["config"]["preset"] == "shampoo" and "parameter_rms" not in true["config"]
    cache = json.loads((lt.RESULTS / "lr_transfer_runs.json").read_text())
    assert muon["key"] in cache  # the committed gpt_muon run: its key did not move
    job = lt.nanogpt_job("preset_muon", 0.02, "true", dict(QUICK_SETUP), "/tmp/x")
    cfg = TrainConfig(**job["config"])
    model = GPT(GPTConfig(block_size=cfg.block_size, n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd))
    opt = build_optimizer(model, cfg)
    assert opt.config.update_scale == "muon" and opt.config.parameter_rms
    assert "transformer.h.0.attn.c_attn.weight" in opt.rms_targets  # gpt_true's blocks: rescaled to Muon's RMS


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
    assert set(data["specs"]) == {"true", "muon"}
    assert set(data["specs"]["true"]["presets"]) == {"muon", "notebook"}
    assert set(data["specs"]["muon"]["presets"]) == {"muon"}
    for st in data["specs"].values():
        for t in st["presets"].values():
            assert set(t["cells"]) == {"paper_mlp tanh", "rnn_train"}
            assert all(len(c["grid"]) == 2 and c["best_lr"] > 0 for c in t["cells"].values())
    caches = {n: (tmp_path / n).read_text() for n in ("lr_transfer_runs.json", "rnn_train_runs.json")}
    # the true-spec muon runs carry the parameter_rms suffix, the Muon-style arms their own names
    own = json.loads(caches["lr_transfer_runs.json"])
    assert "paper_mlp_tanh/preset_muon/lr0.02/seed0/steps5/parameter_rms" in own
    assert "paper_mlp_tanh/preset_muon~muon/lr0.02/seed0/steps5" in own
    md = (tmp_path / "lr_transfer.md").read_text()
    assert md.splitlines()[2].startswith("Command: `python -m benchmarks.lr_transfer --quick`")
    assert "### True-symmetry spec" in md and "### Muon-style spec" in md
    lt.main(["--quick", "--out", str(tmp_path)])
    assert {n: (tmp_path / n).read_text() for n in caches} == caches


def test_a_grid_step_rounded_to_three_digits_counts_as_three_and_four_does_not():
    """0.00333 is one factor-3 step below 0.01 on the grid (rates keep 3 significant digits): within 3x."""
    assert ltg.grid_rate(0.01 / 3) == 0.00333
    assert ltr.within_goal({"bound": "", "ratio": 0.00333 / 0.01})
    assert ltr.within_goal({"bound": "", "ratio": 0.0301 / 0.01})
    assert not ltr.within_goal({"bound": "", "ratio": 0.0025 / 0.01})
    assert not ltr.within_goal({"bound": "<=", "ratio": 1.0})


def test_spec_arms_name_their_spec_variant_and_keep_the_presets_options():
    assert arm_name("soap", None, "muon") == "preset_soap~muon"
    assert arm_name("notebook", "adamw", "muon") == "preset_notebook@adamw~muon"
    assert arm_name("muon") == arm_name("muon", None, "true") == "preset_muon"  # the true spec: the old names
    assert preset_options("preset_notebook@adamw~muon") == {"preset": "notebook", "update_scale": "adamw"}
    assert [preset_spec(a) for a in ("preset_soap~muon", "preset_soap", "symo_notebook", "adam")] == \
        ["muon", "true", "true", "true"]
    with pytest.raises(ValueError, match="unknown spec variant"):
        arm_name("muon", None, "gpt_true")
    with pytest.raises(ValueError, match="unknown spec variant"):
        preset_options("preset_muon~nonesuch")


def test_key_suffixes_mark_exactly_the_runs_whose_code_changed():
    """True-spec runs under Muon's scale (parameter_rms) and eigen_adam's (SOAP's conventions) get new keys; the
    others keep theirs (their cached runs are reused); the Muon-style runs of the presets whose documented rate
    moved (and with it their AdamW side's rate) get new keys, the others keep theirs."""
    assert lt.key_suffix("muon", None, "true") == "/parameter_rms"
    assert lt.key_suffix("then_orthogonalize", None, "true") == "/parameter_rms"
    assert lt.key_suffix("notebook", "muon", "true") == "/parameter_rms"  # an alternative scale that is Muon's
    assert lt.key_suffix("eigen_adam", None, "true") == "/soap_conventions"
    assert lt.key_suffix("eigen_adam", "adamw", "true") == "/soap_conventions"
    for preset, scale in (("published", None), ("published", "adamw"), ("notebook", None), ("shampoo", None),
                          ("soap", None), ("muon", "adamw")):
        assert lt.key_suffix(preset, scale, "true") == "", (preset, scale)
    for preset in lt.MUON_STYLE_PRESETS:
        moved = preset in ("eigen_adam", "soap")
        assert lt.key_suffix(preset, None, "muon") == ("/documented9e-3" if moved else ""), preset
    with pytest.raises(ValueError, match="unknown spec variant"):
        lt.key_suffix("muon", None, "gpt_muon")


def test_each_spec_column_measures_its_presets_and_says_why_a_cell_is_not_measured():
    presets = list(lt.GRID_CENTRE)
    assert lt.spec_presets("true", presets) == presets
    assert set(lt.spec_presets("muon", presets)) == {"muon", "then_orthogonalize", "eigen_adam", "soap", "soap_muon"}
    assert "soap_muon" in presets  # symo train's default preset is measured on every problem
    assert lt.not_measured("soap", "true", "mnist_autoencoder") is None  # the costliest cell, measured
    assert lt.not_measured("soap", "true", "rnn_train") is None
    assert lt.not_measured("soap", "muon", "mnist_autoencoder") is None
    for preset in presets:  # nanoGPT: both columns (gpt_true, gpt_muon), every preset, read or trained
        for spec in lt.SPECS:
            assert lt.not_measured(preset, spec, "nanogpt") is None, (preset, spec)
            assert (preset in lt.NANOGPT_SOURCES[spec]) != (preset in lt.NANOGPT_TRAINED[spec]), (preset, spec)
    assert "true spec only" in lt.not_measured("shampoo", "muon", "train_mlp tanh")
    assert "soap_heavyball" not in lt.GRID_CENTRE  # not measured: the md names it


def test_the_true_specs_cover_every_parameter_and_the_muon_style_specs_leave_the_biases_to_adamw(one_thread):
    """So the AdamW side's new rate (following lr) changes no cached true-spec run."""
    with pytest.warns(UserWarning):  # the true specs' wide blocks (autoencoder, RNN) are warned about
        uncovered = {(q, spec): lt.uncovered_parameters(q, spec) for q in lt.SMALL for spec in lt.SPECS}
    assert all(uncovered[(q, "true")] == [] for q in lt.SMALL)
    assert uncovered[("train_mlp tanh", "muon")] == ["fc1.bias", "fc2.bias"]
    assert uncovered[("mnist_autoencoder", "muon")] == [f"fc{i}.bias" for i in range(1, 5)]
    assert uncovered[("rnn_train", "muon")] == ["b_h", "b_y"]
    assert uncovered[("paper_mlp tanh", "muon")] == []  # no biases


def _cells(finals_by_problem: dict[str, dict[float, float]], preset: str, spec: str) -> dict:
    return {(preset, None, q): lt.Cell(preset, None, q, finals=f, spec=spec) for q, f in finals_by_problem.items()}


def test_the_goal_is_evaluated_per_spec_and_the_md_has_a_table_per_spec(monkeypatch):
    # a cell left out with its reason (none is today), as NOT_MEASURED would hold it
    monkeypatch.setitem(ltg.NOT_MEASURED, ("soap", "true", "mnist_autoencoder"),
                        "not measured: the true spec puts fc2 and fc3 each into one 4096-wide block")
    good = {0.001: 1.0, 0.003: 0.0, 0.009: 1.0}      # best 3e-3: 1x soap's documented rate
    far = {3.33e-5: 1.0, 0.0001: 0.0, 0.0003: 1.0}   # best 1e-4: 1/30x
    documented = {"soap": 3e-3}
    columns = ["rnn_train", "mnist_autoencoder", "nanogpt"]
    true = ltr.summarise(_cells({"rnn_train": good}, "soap", "true"), ["soap"], columns[:2], documented, spec="true",
                        columns=columns)
    muon = ltr.summarise(_cells({"rnn_train": far, "mnist_autoencoder": good}, "soap", "muon"), ["soap"],
                        columns[:2], documented, spec="muon", columns=columns)
    assert true["goal_met"] and true["cells_measured"] == 1
    assert set(true["presets"]["soap"]["not_measured"]) == {"mnist_autoencoder"}  # nanoGPT: no reason, not here
    assert not muon["goal_met"] and (muon["cells_within_goal"], muon["cells_measured"]) == (1, 2)
    assert set(muon["presets"]["soap"]["not_measured"]) == set()  # nanoGPT soap: not in these cells, no reason
    data = ltr.summarise_specs({"true": true, "muon": muon})
    assert not data["goal_met"] and (data["cells_within_goal"], data["cells_measured"]) == (2, 3)
    data["meta"] = {"command": "python -m benchmarks.lr_transfer", "wall_s": 60.0, "runs": 6, "run_seconds": 60.0,
                    "muon_style_presets": ["soap"], "presets_not_measured": ["soap_heavyball"]}
    md = ltr.markdown(data)
    true_table = md[md.index("### True-symmetry spec (goal: met, 1 of 1 cells)"):md.index("### Muon-style spec")]
    assert "| soap | 0.003 | 1x | not measured | - | yes |" in true_table
    muon_table = md[md.index("### Muon-style spec (goal: not met, 1 of 2 cells)"):md.index("## Best rates and")]
    assert "| soap | 0.003 | 1/30x | 1x | - | no |" in muon_table
    assert "| soap | true | 0.003 | 0.003 | not measured | - |" in md
    assert "| soap | muon | 0.003 | 0.0001 | 0.003 | - | 30x |" in md
    assert "- soap, true spec, mnist_autoencoder: not measured: the true spec puts fc2 and fc3" in md
    assert "soap_heavyball" in md
