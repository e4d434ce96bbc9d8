"""`symo compile --optimizer`: the optimizer report."""

from pathlib import Path

import symo.cli

MUON = str(Path(__file__).resolve().parent.parent / "specs" / "muon.toml")


def test_optimizer_report_lists_backends_adamw_and_memory(capsys):
    assert symo.cli.main(["compile", MUON, "--model", "symo.train.models:mlp_tanh",
                          "--no-disk-cache", "--optimizer"]) == 0
    out = capsys.readouterr().out
    assert "backend=" in out
    assert "AdamW: fc1.bias, fc2.bias, fc3.bias" in out
    assert "of AdamW" in out and "of Shampoo" in out


def test_optimizer_report_needs_a_model(capsys):
    assert symo.cli.main(["compile", MUON, "--shapes", "fc1.weight=4x3",
                          "--no-disk-cache", "--optimizer"]) == 2
    assert "needs --model" in capsys.readouterr().err
