"""`symo train --symo-option KEY=VALUE`: any option of symo.Symo over the run's preset, read as data, checked by
Symo's own config before the run folder exists, kept in the checkpoint and held to on resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cases import tiny

from symo import cli
from symo.train import build_optimizer, train
from symo.train.checkpoint import CheckpointError, save_checkpoint
from symo.train.config import parse_symo_option
from symo.train.models import GPT, GPTConfig


def optimizer_of(cfg):
    model = GPT(GPTConfig(block_size=cfg.block_size, vocab_size=11, n_layer=cfg.n_layer, n_head=cfg.n_head,
                          n_embd=cfg.n_embd))
    return build_optimizer(model, cfg)


@pytest.mark.parametrize("text, expected", [
    ("eigenbasis_power=0.5", ("eigenbasis_power", 0.5)),
    ("precondition_every=3", ("precondition_every", 3)),
    ("two_sided=false", ("two_sided", False)),
    ("nesterov=True", ("nesterov", True)),
    ("geometric_mean_with=none", ("geometric_mean_with", None)),
    ("eps=1e-10", ("eps", 1e-10)),
    ("adamw_betas=0.9,0.95", ("adamw_betas", (0.9, 0.95))),
    ("backend=eigh", ("backend", "eigh")),
    (" beta1 = 0.9 ", ("beta1", 0.9)),
    ("statistic=__import__('os').getcwd()", ("statistic", "__import__('os').getcwd()")),  # text, never run
])
def test_a_value_is_read_as_data(text, expected):
    key, value = parse_symo_option(text)
    assert (key, value) == expected and type(value) is type(expected[1])


def test_the_options_reach_the_optimizer_over_the_preset_and_over_symo_defaults(tmp_path):
    opt = optimizer_of(tiny(tmp_path, symo_options={"eigenbasis_power": 0.5, "two_sided": False, "beta2": 0.99}))
    flat = opt.config.flat()
    assert (flat["eigenbasis_power"], flat["two_sided"], flat["beta2"]) == (0.5, False, 0.99)
    assert flat["preconditioner"] == "then_orthogonalize" and flat["adam_beta2"] == 0.95  # the rest: the preset's
    plain = optimizer_of(tiny(tmp_path, preset=None)).config.flat()
    assert plain["update_scale"] == "muon"  # symo train's Symo defaults take Muon's scale ...
    natural = optimizer_of(tiny(tmp_path, preset=None, symo_options={"update_scale": "natural"})).config.flat()
    assert natural["update_scale"] == "natural"  # ... which an option overrides
    with_flag = optimizer_of(tiny(tmp_path, precondition_frequency=3, symo_options={"beta1": 0.9})).config.flat()
    assert (with_flag["precondition_frequency"], with_flag["beta1"]) == (3, 0.9)


def test_a_bad_option_is_refused_by_name_before_the_run_folder_exists(tmp_path, capsys):
    base = ["train", "--data", str(tiny(tmp_path).data), "--steps", "2", "--no-progress"]
    run = tmp_path / "run"
    assert cli.main([*base, "--out-dir", str(run), "--symo-option", "bogus=1"]) == 2
    assert "--symo-option (bogus=1): unknown option 'bogus'" in capsys.readouterr().err and not run.exists()
    assert cli.main([*base, "--out-dir", str(run), "--symo-option", "eigenbasis_power=2"]) == 2
    assert "eigenbasis_power must be in (0, 1]" in capsys.readouterr().err and not run.exists()
    assert cli.main([*base, "--out-dir", str(run), "--symo-option", "refresh=eigh"]) == 2
    assert "is set from Python" in capsys.readouterr().err and not run.exists()
    assert cli.main([*base, "--optimizer", "muon", "--symo-option", "beta1=0.9"]) == 2
    assert "--symo-option: not used by --optimizer muon" in capsys.readouterr().err
    for given, says in (("eigenbasis_power", "expected KEY=VALUE"),
                        ("weight_decay=0.1", "weight_decay: set it with --weight-decay"),
                        ("ns_method=iterate", "ns_method: set it with --ns-method"),
                        ("1x=2", "'1x' is not an option name")):
        with pytest.raises(SystemExit) as exited:
            cli.main([*base, "--symo-option", given])
        assert exited.value.code == 2 and f"argument --symo-option: {says}" in capsys.readouterr().err, given
    with pytest.raises(ValueError, match="--optimizer muon reads none"):  # from Python, as on the command line
        tiny(tmp_path, optimizer="muon", symo_options={"beta1": 0.9})
    with pytest.raises(ValueError, match="symo_options must be a dict"):
        tiny(tmp_path, symo_options=["beta1=0.9"])
    with pytest.raises(SystemExit):
        cli.main([*base, "--symo-option", "beta1=0.9", "--symo-option", "beta1=0.8"])
    assert "beta1 is given twice (0.9 and 0.8)" in capsys.readouterr().err


def test_a_resumed_run_keeps_its_options_and_refuses_others(tmp_path, capsys):
    """`--resume RUN_DIR` alone takes the options from the checkpoint, and ends where the run straight through
    ends; other options on resume name the setting that differs."""
    options = {"eigenbasis_power": 0.5, "beta2": 0.99}
    straight = train(tiny(tmp_path, out_dir=str(tmp_path / "straight"), symo_options=options, steps=4))
    first = tiny(tmp_path, symo_options=options, steps=4)

    def interrupt(step, row):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(first, callback=interrupt)
    assert cli.main(["train", "--resume", first.out_dir, "--symo-option", "eigenbasis_power=1"]) == 2
    assert "--symo-option: checkpoint {'eigenbasis_power': 0.5, 'beta2': 0.99} vs now {'eigenbasis_power': 1}" in (
        capsys.readouterr().err)
    assert cli.main(["train", "--resume", first.out_dir, "--no-progress"]) == 0
    assert "eigenbasis_power 0.5, beta2 0.99)" in capsys.readouterr().out  # the header names them
    blob = torch.load(Path(first.out_dir) / "ckpt.pt", weights_only=True)
    assert blob["step"] == 4 and blob["options"]["symo_options"] == options
    for name, w in straight["model"].state_dict().items():
        assert torch.equal(w, blob["model"][name]), name


def test_a_checkpoint_from_before_these_settings_resumes_and_a_refresh_period_is_held_to(tmp_path):
    """A checkpoint written before --symo-option (and before --precondition-frequency was always recorded) lacks
    both settings: it ran with neither, and resumes. A run saved with a refresh period resumed without one (the
    library's TrainConfig, where the command line would fill it in) is refused, not silently changed."""
    cfg = tiny(tmp_path, steps=2)
    train(cfg)
    path = Path(cfg.out_dir) / "ckpt.pt"
    blob = torch.load(path, weights_only=True)
    for key in ("symo_options", "precondition_frequency"):
        del blob["settings"][key]
        del blob["options"][key]
    save_checkpoint(path, {k: v for k, v in blob.items() if k != "format"})
    assert train(tiny(tmp_path, steps=3, resume=True))["steps"] == 3
    every = tiny(tmp_path, out_dir=str(tmp_path / "every"), precondition_frequency=2, steps=2)
    train(every)
    with pytest.raises(CheckpointError, match="--precondition-frequency: checkpoint 2 vs now None"):
        train(tiny(tmp_path, out_dir=every.out_dir, steps=3, resume=True))
