"""Frictions a new user met in the first hour, each fixed and kept fixed: what a NaN gradient's message
says about the data, one-line usage errors, a README command that runs as written, merge errors that say
the models differ, check_symmetry's dtype message, the Python default rate, and extending a finished run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
from cases import tiny
from torch.func import functional_call

import symo
import symo.cli
from symo.alignment import AlignError
from symo.runtime.compiled import NonFiniteGradientError
from symo.train import build_optimizer, train
from symo.train.checkpoint import CheckpointError, save_checkpoint
from symo.train.models import GPT, GPTConfig, gpt_small

REPO = Path(__file__).resolve().parents[1]
COMMANDS = ("train", "compile", "params", "check", "infer", "equivariance", "align", "merge")


# ---------------------------------------------------------------- a NaN gradient names the data too
def test_a_nan_in_the_input_batch_is_named_as_a_cause() -> None:
    torch.manual_seed(0)
    model = symo.models.mlp_tanh()
    opt = symo.Symo(model.named_parameters(), "mlp_tanh")
    x = torch.randn(4, 8)
    x[1, 2] = float("nan")
    model(x).pow(2).mean().backward()
    with pytest.raises(NonFiniteGradientError) as info:
        opt.step()
    text = str(info.value)
    assert "input batch holds NaN or inf" in text and "torch.isfinite(x)" in text, text
    assert "lower the learning rate" in text  # the other cause stays named


def test_symo_train_says_its_batch_is_not_the_cause(tmp_path: Path) -> None:
    """symo train's batches are token ids: the loop rules the data out and names the step and its loss."""
    cfg = tiny(tmp_path, steps=3)
    models = []

    def factory(model: GPT) -> torch.optim.Optimizer:
        models.append(model)
        return build_optimizer(model, cfg)

    def poison(step: int, row: dict[str, float]) -> None:  # weights gone bad: the next loss is NaN
        if step == 1:
            with torch.no_grad():
                models[0].transformer.wte.weight.fill_(float("nan"))

    with pytest.raises(NonFiniteGradientError) as info:
        train(cfg, callback=poison, optimizer_factory=factory)
    text = str(info.value)
    assert text.startswith("step 2: gradient of parameter"), text
    assert "the input batch is token ids (integers, never NaN or inf) and the loss was nan" in text
    assert "lower --lr (0.02)" in text


# ---------------------------------------------------------------- usage errors: one line
@pytest.mark.parametrize("command", COMMANDS)
def test_usage_errors_are_one_line_naming_the_command(command: str, capsys: pytest.CaptureFixture) -> None:
    for argv in ([command, "--no-such-option"], [command, "--no-such-option", "x", "y", "--model", "m:f"]):
        with pytest.raises(SystemExit) as info:
            symo.cli.main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "usage:" not in err, err
        assert err.startswith(f"symo {command}: error: ") and err.endswith(f"; see symo {command} --help\n"), err
    if command == "train":
        with pytest.raises(SystemExit):
            symo.cli.main(["train", "--no-such-option"])
        assert capsys.readouterr().err == ("symo train: error: unrecognized arguments: --no-such-option; see symo "
                                           "train --help\n")


def test_top_level_usage_errors_are_one_line(capsys: pytest.CaptureFixture) -> None:
    for argv in ([], ["no-such-command"]):
        with pytest.raises(SystemExit) as info:
            symo.cli.main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and err.startswith("symo: error: "), err
        assert err.endswith("; see symo --help\n")


# ---------------------------------------------------------------- the README's commands run as written
def test_readme_shapes_command_runs_as_written(capsys: pytest.CaptureFixture) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    lines = [line for line in readme.splitlines() if line.startswith("symo ") and "--shapes" in line]
    assert lines, "the README shows a --shapes command"
    for line in lines:
        argv = shlex.split(line, comments=True)
        assert "..." not in line, line
        assert symo.cli.main([*argv[1:], "--no-disk-cache"]) == 0, line
        assert "uncovered" in capsys.readouterr().out.lower()


# ---------------------------------------------------------------- merge: different models, whole names
def _gpt_checkpoint(path: Path) -> str:
    options = {"block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 16, "bias": True}
    gpt = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=5, block_size=8))
    return str(save_checkpoint(path, {"model": gpt.state_dict(), "optimizer": {}, "settings": {"vocab": "abcde"},
                                      "options": options}))


def _quoted_are_whole(err: str, names: set[str]) -> list[str]:
    quoted = re.findall(r"'([^']*)'", err)
    assert quoted and all(q in names for q in quoted), (quoted, err)
    return quoted


def test_merge_of_different_models_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    gpt = _gpt_checkpoint(tmp_path / "run" / "ckpt.pt")
    mlp = tmp_path / "mlp.pt"
    torch.save(symo.models.mlp_tanh().state_dict(), mlp)
    names = set(torch.load(gpt, weights_only=True)["model"]) | set(torch.load(mlp, weights_only=True))
    out = tmp_path / "merged.pt"
    for extra in ([], ["--model", "symo.train.models:mlp_tanh"]):
        assert symo.cli.main(["merge", gpt, str(mlp), "-o", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {gpt} and {mlp} are different models: only {gpt} has 'transformer."), err
        assert f"; only {mlp} has 'fc1.weight'" in err and "more" in err and err.count("\n") == 1
        _quoted_are_whole(err, names)
    assert not out.exists()


def test_a_file_that_does_not_fit_the_model_names_whole_keys(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state = symo.models.mlp_tanh().state_dict()
    files = []
    for name in ("a.pt", "b.pt"):
        files.append(str(tmp_path / name))
        torch.save(state, files[-1])
    assert symo.cli.main(["merge", *files, "-o", str(tmp_path / "m.pt"), "--model", "symo.train.models:gpt_small"]) == 2
    err = capsys.readouterr().err
    model_names = set(gpt_small().state_dict())
    assert "does not fit --model symo.train.models:gpt_small: only the file has 'fc1.weight'" in err, err
    assert "Unexpected key(s)" not in err and "; only the model has 'transformer.wte.weight'" in err
    _quoted_are_whole(err, set(state) | model_names)


def test_interpolate_of_different_models_names_their_entries() -> None:
    with pytest.raises(AlignError) as info:
        symo.interpolate(symo.models.mlp_tanh(), GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=5,
                                                                block_size=8)), 0.5)
    text = str(info.value)
    assert text.startswith("a and b are different models (only a has 'fc1.weight'") and "only b has" in text, text


# ---------------------------------------------------------------- check_symmetry: float vs double
@pytest.mark.parametrize("params_dtype,data_dtype", [(torch.float64, torch.float32), (torch.float32, torch.float64)])
def test_check_symmetry_explains_a_dtype_mismatch(params_dtype: torch.dtype, data_dtype: torch.dtype) -> None:
    model = symo.models.mlp_tanh()
    compiled = symo.compile("mlp_tanh", model, disk_cache=False)
    x = torch.randn(4, 8, dtype=data_dtype)
    params = {n: p.detach().to(params_dtype) for n, p in model.named_parameters()}
    name = str(params_dtype).removeprefix("torch.")
    with pytest.raises(TypeError) as info:
        symo.check_symmetry(lambda p: functional_call(model, p, (x,)).pow(2).sum(), compiled, params)
    text = str(info.value)
    assert text.startswith(f"loss_fn failed with the parameters in {name} (") and "same dtype" in text, text
    assert f"must be {name} too: cast the data" in text
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained torch traceback


# ---------------------------------------------------------------- the Python default rate is written down
def test_python_default_rate_is_documented() -> None:
    model = symo.models.mlp_tanh()
    assert symo.Symo(model.named_parameters(), "mlp_tanh").param_groups[0]["lr"] == 1e-3
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    section = readme[readme.index("## The Symo optimizer"):readme.index("## Training a GPT")]
    assert "Without `lr` their rate is 1e-3 at the natural scale" in section
    assert "`symo train`'s default rate, 0.02, is at Muon's scale" in section
    doc = " ".join(symo.Symo.__doc__.split())
    assert "or 1e-3 without a preset, at the default natural scale" in doc and "symo train`'s default 0.02" in doc


# ---------------------------------------------------------------- extending a finished run
def _train_argv(cfg) -> list[str]:
    return ["train", "--data", cfg.data, "--cache-dir", cfg.cache_dir, "--out-dir", cfg.out_dir, "--n-layer", "1",
            "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4", "--steps", "3",
            "--warmup", "2", "--eval-interval", "2", "--eval-batches", "1", "--sample-chars", "0", "--threads", "1",
            "--no-progress"]


def test_a_finished_run_is_extended_by_a_larger_steps(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = tiny(tmp_path)
    run = Path(cfg.out_dir)
    assert symo.cli.main(_train_argv(cfg)) == 0
    capsys.readouterr()
    assert symo.cli.main(["train", "--resume", str(run), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "--steps 2 would shorten it" in err and "give more than 3 to extend it" in err, err
    assert symo.cli.main(["train", "--resume", str(run), "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert f"run folder: {run} (resumed at step 3 of 5)" in out
    assert ("extended to 5 steps: the learning-rate schedule keeps its 3 steps (warm-up, cosine decay), and steps 4 "
            "to 5 run at the rate its cosine ends at, --min-lr-ratio 0.1 x the rate (lr 0.002, adamw-lr 0.0003)") in out
    assert "step 5: val loss" in out
    blob = torch.load(run / "ckpt.pt", weights_only=True)
    assert blob["step"] == 5 and blob["schedule_steps"] == 3 and blob["settings"]["steps"] == 5
    lrs = blob["history"]["lr"]
    assert lrs[1:4] == pytest.approx([0.01, 0.02, 0.02]) and lrs[4:] == pytest.approx([0.002, 0.002]), lrs
    assert symo.cli.main(["train", "--resume", str(run)]) == 0  # finished again: nothing left, says how to extend
    assert "a larger --steps extends the run" in capsys.readouterr().out


def test_an_extended_run_resumes_bit_identically(tmp_path: Path) -> None:
    """The checkpoint records the schedule's length: an extension stopped midway and resumed ends with the
    weights of the extension that never stopped."""
    weights = []
    for name, stop_at in (("a", None), ("b", 4)):
        base = tiny(tmp_path, out_dir=str(tmp_path / name), steps=3)
        train(base)
        extended = tiny(tmp_path, out_dir=str(tmp_path / name), steps=6, resume=True)

        def interrupt(step: int, row: dict[str, float], stop_at: int | None = stop_at) -> None:
            if step == stop_at:
                raise KeyboardInterrupt

        if stop_at is None:
            weights.append(train(extended)["model"].state_dict())
            continue
        with pytest.raises(KeyboardInterrupt):
            train(extended, callback=interrupt)
        weights.append(train(extended)["model"].state_dict())
    for n, a in weights[0].items():
        assert torch.equal(a, weights[1][n]), n
    with pytest.raises(CheckpointError, match="would shorten"):
        train(tiny(tmp_path, out_dir=str(tmp_path / "a"), steps=5, resume=True))
