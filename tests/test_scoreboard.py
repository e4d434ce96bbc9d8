"""benchmarks/scoreboard.py on synthetic results: best variant per side, ratio, winner, ties, cosines."""

from __future__ import annotations

import json

from benchmarks import scoreboard as sb


def test_scoreboard_picks_the_best_of_each_side_and_names_the_winner(tmp_path, monkeypatch):
    monkeypatch.setattr(sb, "RESULTS", tmp_path)
    (tmp_path / "nanogpt_compare.json").write_text(json.dumps({"optimizers": {
        "symo_muon": {"val_final_mean": 1.90}, "symo_true": {"val_final_mean": 1.80},
        "muon": {"val_final_mean": 2.00}, "adamw": {"val_final_mean": 2.20}}}))
    (tmp_path / "nanogpt_compare_reference.json").write_text(json.dumps({"optimizers": {
        "symo_true_notebook": {"val_final_mean": 1.70}, "muon": {"val_final_mean": 1.60}}}))
    (tmp_path / "rnn_train.json").write_text(json.dumps({"optimizers": {
        "symo_rnn": {"loss_final_mean": 0.1000}, "adam": {"loss_final_mean": 0.1005}}}))
    (tmp_path / "hessian_cosine.json").write_text(json.dumps({"teacher_student": {"net": {"estimators": {
        "symo (true group)": {"points": {"late": {"cos_frobenius": [0.3, 0.0]}}},
        "kfac": {"points": {"late": {"cos_frobenius": [0.6, 0.0]}}}}}}}))
    (tmp_path / "soap_seeds.json").write_text(json.dumps({"regimes": {"reference": {"arms": {
        "muon": {"seeds_3": {"final_val_mean": 1.55}, "seeds_6": {"final_val_mean": 1.54}},
        "symo_soap_muon_gpt_muon": {"seeds_6": {"final_val_mean": 1.52}}, "soap": {"seeds_3": {}}}}}}))
    board = sb.scoreboard()
    six = board["nanogpt_matrix reference, six seeds"]  # arms without six seeds are left out
    assert six["symo_best"] == {"variant": "symo_soap_muon_gpt_muon", "value": 1.52}
    assert six["baseline_best"] == {"name": "muon", "value": 1.54}
    gpt = board["nanogpt_compare"]
    assert gpt["symo_best"] == {"variant": "symo_true", "value": 1.80}
    assert gpt["baseline_best"] == {"name": "muon", "value": 2.00}
    assert abs(gpt["ratio"] - 0.9) < 1e-12 and gpt["winner"] == "symo_true"
    assert board["nanogpt_compare_reference"]["winner"] == "muon"     # its own row, from its own file
    assert board["rnn_train"]["winner"] == "tie (within 1%)"
    cos = board["hessian_cosine net"]           # higher is better: the larger cosine wins
    assert cos["symo_best"]["value"] == 0.3 and cos["baseline_best"]["value"] == 0.6 and cos["winner"] == "kfac"
    assert set(board) == {"nanogpt_compare", "nanogpt_compare_reference", "rnn_train", "hessian_cosine net",
                          "nanogpt_matrix reference, six seeds"}   # missing files are skipped
