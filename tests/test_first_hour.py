"""A new user's first hour with the command line: a model module in the current folder, the CLI's
messages, and the options a resumed run takes from its checkpoint."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cases import tiny

import symo.cli

USER_MODELS = '''
import torch.nn as nn


def factory():
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
'''


def test_model_module_from_the_current_folder_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """`--model mymodels:factory` imports ./mymodels.py as `python -m` would, without PYTHONPATH."""
    name = f"user_models_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(USER_MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert symo.cli.main(["params", "--model", f"{name}:factory"]) == 0
    out = capsys.readouterr().out
    assert "0.weight  (5, 3)" in out and "2.bias    (2,)" in out


def test_a_broken_model_module_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    name = f"broken_models_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text("def factory(:\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert symo.cli.main(["params", "--model", f"{name}:factory"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --model '{name}:factory': importing '{name}' raised SyntaxError"), err


@pytest.mark.slow
def test_console_script_finds_a_model_in_the_current_folder(tmp_path: Path) -> None:
    """The installed `symo` script (whose sys.path[0] is its bin folder, not the current folder)."""
    (tmp_path / "mymodels.py").write_text(USER_MODELS)
    script = Path(sys.executable).with_name("symo")
    command = [str(script)] if script.is_file() else [sys.executable, "-c", "import sys, symo.cli; "
                                                      "sys.exit(symo.cli.main())"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([*command, "params", "--model", "mymodels:factory"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "4 parameters, 32 numbers" in done.stdout


REPO = Path(__file__).resolve().parents[1]


def test_readme_says_how_to_call_the_cli_and_lists_each_folder_once() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    quickstart_end = readme.index("## Python API")
    first_cli = readme.index("symo params --model")
    assert "source .venv/bin/activate" in readme[:quickstart_end] and ".venv/bin/symo" in readme[:quickstart_end]
    assert readme.index("source .venv/bin/activate") < first_cli < quickstart_end
    layout = readme[readme.index("## Layout"):].split("```")[1]
    folders = [line.split()[0] for line in layout.splitlines() if line[:1].strip()]
    assert len(folders) == len(set(folders)), folders
    for folder in folders:
        if folder.endswith("/"):
            assert (REPO / folder).is_dir(), folder


def _train_args(tmp_path: Path) -> list[str]:

    cfg = tiny(tmp_path)
    return ["train", "--data", cfg.data, "--cache-dir", cfg.cache_dir, "--out-dir", cfg.out_dir, "--n-layer", "1",
            "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4", "--steps", "3",
            "--eval-interval", "2", "--eval-batches", "1", "--sample-chars", "20", "--optimizer", "adamw",
            "--threads", "1"]


def test_no_progress_silences_only_the_bar(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = _train_args(tmp_path)
    run = Path(args[args.index("--out-dir") + 1])
    assert symo.cli.main([*args, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert f"run folder: {run}" in out and "step 3: val loss" in out and "--- sample ---" in out
    assert f"loss plot: {run / 'loss.png'}" in out and f"checkpoint: {run / 'ckpt.pt'}" in out
    assert "steps" not in err and "\r" not in err  # no bar at all


def test_progress_on_a_log_file_is_plain_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """capsys is not a terminal, as a log file is not: the bar becomes whole lines, no carriage returns."""
    assert symo.cli.main(_train_args(tmp_path)) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("1/3 steps (33%)") and lines[-1].startswith("3/3 steps (100%)"), lines
    assert "loss " in lines[-1] and "val " in lines[-1]


def test_plain_progress_lines_are_periodic(capsys: pytest.CaptureFixture) -> None:
    from symo.train.progress import PlainProgress, progress

    assert isinstance(progress(total=3), PlainProgress)  # capsys's stderr is no terminal
    for _ in progress(range(5), desc="runs", unit="run", interval=3600):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == ["runs: 1/5 runs (20%)", "runs: 5/5 runs (100%)"]
    for _ in progress(range(3), unit="run", interval=0):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == ["1/3 runs (33%)", "2/3 runs (67%)", "3/3 runs (100%)"]


TANH_SPEC = '''
[spaces]
h1 = { group = "orthogonal" }       # not a symmetry of tanh: rotations do not commute with it
h2 = { group = "signed_perm" }      # a true symmetry (tanh is odd)
[params]
"fc1.weight" = ["h1", "_"]
"fc1.bias"   = ["h1"]
"fc2.weight" = ["h2", "h1"]
"fc2.bias"   = ["h2"]
"fc3.weight" = ["_", "h2"]
'''


def test_compile_with_a_model_warns_about_each_relaxed_space(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = tmp_path / "tanh.toml"
    spec.write_text(TANH_SPEC)
    base = ["compile", str(spec), "--model", "symo.train.models:mlp_tanh", "--no-disk-cache"]
    assert symo.cli.main(base) == 0
    out, err = capsys.readouterr()
    assert "isotypic" in out.lower() or "block" in out.lower()
    warned = [line.split()[0] for line in err.splitlines() if line.startswith("  ") and "output change" in line]
    assert warned == ["h1"], err  # named, and only the relaxed one
    assert err.startswith("warning: 1 of 2 spaces is not a true symmetry") and "symo check" in err
    assert symo.cli.main([*base, "--no-check"]) == 0
    assert capsys.readouterr().err == ""
    assert symo.cli.main(["compile", "mlp_tanh", "--model", "symo.train.models:mlp_tanh", "--no-disk-cache"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "all 2 spaces with a group are true symmetries" in out


def test_compile_without_a_model_points_to_symo_check(capsys: pytest.CaptureFixture) -> None:
    shapes = "fc1.weight=16x8,fc1.bias=16,fc2.weight=16x16,fc2.bias=16,fc3.weight=4x16,fc3.bias=4"
    assert symo.cli.main(["compile", "mlp_tanh", "--shapes", shapes, "--no-disk-cache"]) == 0
    out = capsys.readouterr().out
    assert "symmetry not checked (no model): run `symo check mlp_tanh --model module:factory`" in out
    assert symo.cli.main(["compile", "mlp_tanh", "--shapes", shapes, "--no-disk-cache", "--optimizer"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: --optimizer needs --model")


def _tanh_shapes() -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in symo.models.mlp_tanh().named_parameters()}


def test_partial_spec_for_a_subset_of_the_parameters() -> None:
    """strict=False drops the rules whose parameters are absent; what remains equals the spec written by
    hand for the subset (compared as dense curvature on random gradients)."""
    import torch

    subset = {n: s for n, s in _tanh_shapes().items() if n.startswith("fc1.")}  # fine-tune layer 1 only
    with pytest.raises(symo.SpecError, match=r"strict=False \(CLI: --partial\)"):
        symo.compile("mlp_tanh", subset)
    partial = symo.compile("mlp_tanh", subset, strict=False, sizes={"h2": 16})  # h2's size: ignored, unused
    by_hand = symo.compile(symo.parse_spec('[spaces]\nh1 = "signed_perm"\n[params]\n"fc1.weight" = ["h1", "_"]\n'
                                           '"fc1.bias" = ["h1"]\n'), subset)
    assert partial.param_names == by_hand.param_names == ["fc1.weight", "fc1.bias"]
    assert partial.spaces == by_hand.spaces == {"h1": {"group": "signed_perm", "size": 16, "per": None}}
    assert partial.uncovered == {}
    gen = torch.Generator().manual_seed(0)
    grads = {n: torch.randn(s, generator=gen, dtype=torch.float64) for n, s in subset.items()}
    assert torch.allclose(partial.orbit_average(grads).dense(), by_hand.orbit_average(grads).dense(), atol=1e-12)
    with pytest.raises(symo.SpecError, match="no rule of the spec matches any parameter"):
        symo.compile("mlp_tanh", {"other.weight": (3, 3)}, strict=False)
    with pytest.raises(TypeError, match="strict"):
        symo.compile("mlp_tanh", subset, strict="no")


def test_cli_partial(capsys: pytest.CaptureFixture) -> None:
    shapes = "fc1.weight=16x8,fc1.bias=16"
    assert symo.cli.main(["compile", "mlp_tanh", "--shapes", shapes, "--no-disk-cache"]) == 2
    assert "--partial" in capsys.readouterr().err
    assert symo.cli.main(["compile", "mlp_tanh", "--shapes", shapes, "--no-disk-cache", "--partial"]) == 0
    assert "fc1.weight" in capsys.readouterr().out


def test_train_partial_drops_rules_and_trains_as_the_full_spec(tmp_path: Path, capsys: pytest.CaptureFixture
                                                                ) -> None:
    import torch

    from symo.train import train

    spec = tmp_path / "gpt_plus.toml"  # gpt_true plus a rule for a parameter this GPT does not have
    spec.write_text((REPO / "specs" / "gpt_true.toml").read_text() + '"transformer.h.{i}.attn.q_norm.weight" = ["_"]\n')
    with pytest.raises(symo.SpecError, match="--partial"):
        train(tiny(tmp_path, out_dir=str(tmp_path / "strict"), spec=str(spec), steps=2))
    partial = train(tiny(tmp_path, out_dir=str(tmp_path / "a"), spec=str(spec), steps=2, partial=True))
    plain = train(tiny(tmp_path, out_dir=str(tmp_path / "b"), spec="gpt_true", steps=2))
    for (n, a), b in zip(partial["model"].state_dict().items(), plain["model"].state_dict().values()):
        assert torch.equal(a, b), n


@pytest.mark.slow
def test_help_imports_no_heavy_module() -> None:
    """`symo --help` (and every subcommand's --help) imports neither torch nor sympy nor networkx: those
    cost seconds on a loaded machine, and a command imports them only when it runs."""
    code = ("import sys, symo, symo.cli\n"
            "for argv in (['--help'], ['--version'], *[[c, '--help'] for c in ('train', 'compile', 'params', "
            "'check', 'infer', 'equivariance')]):\n"
            "    try:\n        symo.cli.main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'sympy', 'networkx', 'numpy', 'tqdm') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_lazy_package_attributes() -> None:
    """The lazy `symo` package gives the same objects as the modules; `symo.infer` is the package (its
    function is `symo.infer.infer`, and `symo.infer_spec` the root's)."""
    from symo import optim
    from symo.runtime import compiled

    assert symo.infer is sys.modules["symo.infer"] and symo.infer.infer.__name__ == "infer"
    assert symo.infer_spec is symo.infer.infer_spec
    assert symo.Symo is optim.Symo and symo.CompiledSpec is compiled.CompiledSpec
    assert {"Symo", "infer", "compile", "models"} <= set(dir(symo))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        symo.no_such_name  # noqa: B018


def test_device_cuda_on_a_cpu_build_is_a_clear_error(capsys: pytest.CaptureFixture) -> None:
    import torch

    if torch.backends.cuda.is_built():
        pytest.skip("this torch has CUDA; the message under test is the CPU build's")
    assert symo.cli.main(["train", "--device", "cuda", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device cuda: this torch build has no CUDA") and "Traceback" not in err


# ---------------------------------------------------------------- residual bad inputs


@pytest.mark.parametrize("path,needle", [("a" * 5000, "cannot use the path"), ("x/" * 3000 + "s.toml", "cannot use"),
                                         ("sp\x00ec.toml", "NUL byte")], ids=["5000-chars", "deep", "nul"])
def test_unusable_spec_paths_are_spec_errors(path: str, needle: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(symo.SpecError) as info:
        symo.load_spec(path)
    text = str(info.value)
    assert needle in text and "how to fix:" in text and len(text) < 700, text
    if "\x00" not in path:  # (argv cannot carry a NUL)
        assert symo.cli.main(["compile", path, "--shapes", "a=2", "--no-disk-cache"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and needle in err and len(err) < 700


def test_captured_index_that_is_a_digit_but_not_a_number() -> None:
    """'1²'.isdigit() is True but int('1²') fails: such a capture is a name like any other."""
    spec = symo.parse_spec('[spaces]\n"h{i}" = "perm"\n[params]\n"layers.{i}.weight" = ["h{i}", "_"]\n')
    compiled = symo.compile(spec, {"layers.2².weight": (4, 3), "layers.1².weight": (4, 3), "layers.10.weight": (4, 3)},
                            disk_cache=False)
    assert set(compiled.spaces) == {"h1²", "h2²", "h10"}
    assert compiled.param_names == ["layers.2².weight", "layers.1².weight", "layers.10.weight"]


def test_long_names_in_cli_errors_are_shortened(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    long = "a" * 5000
    for argv, status in ((["compile", "mlp_tanh", "--shapes", long], 2), (["params", "--model", long + ":f"], 1),
                         (["train", "--data", long, "--cache-dir", str(tmp_path)], 2),
                         (["train", "--out-dir", str(tmp_path / long), "--cache-dir", str(tmp_path),
                           "--data", str(REPO / "README.md"), "--steps", "1"], 1)):
        assert symo.cli.main(argv) == status, argv[:2]
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err) < 700 and "Traceback" not in err, err[:300]


def test_help_texts_are_whole_sentences(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        symo.cli.main(["--help"])
    out = capsys.readouterr().out
    description = " ".join(out.split("\n\n")[1].split())
    assert description.startswith("Symo: ") and description.endswith("."), description
    assert description.count("`") % 2 == 0 and description.count("(") == description.count(")")
    with pytest.raises(SystemExit):
        symo.cli.main(["train", "--help"])
    lr_help = " ".join(capsys.readouterr().out.split("\n  --lr LR", 1)[1].split("\n  --adamw-lr", 1)[0].split())
    assert "{" not in lr_help and "symo 0.02, muon 0.02, adamw 0.004" in lr_help, lr_help
    bench = REPO / "benchmarks" / "hessian_cosine.py"
    first = bench.read_text().split('"""')[1].splitlines()[0]  # the script's --help description
    assert not re.search(r"\bissue\s*#?\d", first, re.I), first
