"""The `symo align` and `symo merge` commands on saved state dicts and `symo train` checkpoints: the aligned file
computes the other model's function, the merged file is symo.interpolate of the aligned pair, and bad input writes
nothing (the library functions: test_align.py; activation matching from the command line:
test_align_cli_activations.py)."""

from __future__ import annotations

import pytest
import torch
from cases import gpt_checkpoints

from symo.alignment import interpolate
from symo.cli import main
from symo.train.models import MLP

pytestmark = pytest.mark.usefixtures("one_thread_module")


def _save_pair(tmp_path, factory, spec_seeds=(0, 1)):
    paths = []
    for s in spec_seeds:
        torch.manual_seed(s)
        path = tmp_path / f"m{s}.pt"
        torch.save(factory().state_dict(), path)
        paths.append(str(path))
    return paths


def test_cli_align_and_merge_state_dicts(tmp_path, capsys) -> None:
    a, b = _save_pair(tmp_path, lambda: MLP((8, 16, 16, 4), act="relu"))
    out = tmp_path / "b_aligned.pt"
    model = ["--model", "symo.train.models:mlp_relu", "--spec", "mlp_relu", "--no-progress"]
    assert main(["align", a, b, *model, "-o", str(out)]) == 0
    assert "objective" in capsys.readouterr().out
    aligned, original = MLP((8, 16, 16, 4), act="relu"), MLP((8, 16, 16, 4), act="relu")
    aligned.load_state_dict(torch.load(out, weights_only=True))
    original.load_state_dict(torch.load(b, weights_only=True))
    x = torch.randn(5, 8)
    assert torch.allclose(aligned(x), original(x), atol=1e-5)
    merged = tmp_path / "merged.pt"
    assert main(["merge", a, b, *model, "--alpha", "0.5", "-o", str(merged)]) == 0
    first = MLP((8, 16, 16, 4), act="relu")
    first.load_state_dict(torch.load(a, weights_only=True))
    want = interpolate(first, aligned, 0.5).state_dict()
    got = torch.load(merged, weights_only=True)
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    plain = ["--model", "symo.train.models:mlp_relu", "--no-progress"]
    assert main(["merge", a, b, *plain, "--no-align", "-o", str(merged)]) == 0
    assert main(["merge", a, b, *model, "--restarts", "2", "--no-align", "-o", str(merged)]) == 2
    assert ("--no-align interpolates B as given, so --spec, --restarts would have no effect"
            in capsys.readouterr().err)


def test_cli_reads_symo_train_checkpoints_without_model(tmp_path, capsys) -> None:
    paths, options = gpt_checkpoints(tmp_path)
    assert main(["align", *paths, "--no-progress"]) == 0
    out = tmp_path / "run1" / "ckpt_aligned.pt"
    blob = torch.load(out, weights_only=True)
    assert blob["options"] == options and "optimizer" not in blob
    assert "spec inferred" in capsys.readouterr().out


def test_cli_on_symo_train_checkpoints_sizes_gpt_true_and_reports_the_barrier_on_token_data(tmp_path, capsys) -> None:
    """--spec gpt_true on checkpoints takes its per-head sizes from the recorded n_head, and --data of token ids
    with next-token targets gives the cross-entropy barrier (the GPT returns (logits, loss), logits per position)."""
    paths, _ = gpt_checkpoints(tmp_path)
    ids = torch.randint(0, 5, (8, 8), generator=torch.Generator().manual_seed(0))
    data = tmp_path / "tokens.pt"
    torch.save({"inputs": ids, "targets": ids.roll(-1, dims=-1)}, data)
    assert main(["align", *paths, "--spec", "gpt_true", "--no-progress", "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert "loss barrier (cross-entropy on --data, 11 points from A to B): naive" in out and "aligned" in out
    assert (tmp_path / "run1" / "ckpt_aligned.pt").is_file()


@pytest.mark.parametrize("case", ["not a model", "shapes", "spec covers none", "output is an input"])
def test_cli_bad_input_writes_nothing(tmp_path, capsys, case) -> None:
    a, b = _save_pair(tmp_path, lambda: MLP((8, 16, 16, 4), act="relu"))
    out = tmp_path / "out.pt"
    args = ["align", a, b, "--model", "symo.train.models:mlp_relu", "--spec", "mlp_relu", "-o", str(out)]
    if case == "not a model":
        torch.save({"step": 3, "note": "no tensors"}, b)
        message = "not a model checkpoint"
    elif case == "shapes":
        torch.save(MLP((8, 12, 16, 4)).state_dict(), b)
        message = "does not fit --model"
    elif case == "spec covers none":
        args[args.index("mlp_relu", 5)] = "gpt_true"
        message = "covers none"
    else:
        args[-1] = b
        message = "is one of the inputs"
    if case == "output is an input":
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        code = exit_info.value.code
    else:
        code = main(args)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".*tmp*"))
