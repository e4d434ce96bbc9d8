"""The command line as a new user meets it: --version, `symo params`, bundled spec names, a report that
fits in 120 columns and points to the docs for its terms, and no traceback on any error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import symo
import symo.cli

REPO = Path(__file__).resolve().parents[1]


def test_version(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        symo.cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"symo {symo.__version__}"


def test_params_lists_names_and_shapes(capsys: pytest.CaptureFixture) -> None:
    assert symo.cli.main(["params", "--model", "symo.train.models:mlp_tanh"]) == 0
    out = capsys.readouterr().out.splitlines()
    model = symo.models.mlp_tanh()
    rows = {line.split()[0]: line.split(None, 1)[1] for line in out[2:]}
    assert rows == {n: str(tuple(p.shape)) for n, p in model.named_parameters()}
    assert out[0].startswith(f"{len(rows)} parameters, {sum(p.numel() for p in model.parameters()):,} numbers")
    assert symo.cli.main(["params", "--shapes", "a.weight=4x3,b=5"]) == 0
    assert "a.weight  (4, 3)" in capsys.readouterr().out


@pytest.mark.parametrize("spec,model,options", [
    ("gpt", "gpt_small", ["--optimizer"]),
    ("gpt_muon", "gpt_bench", ["--optimizer"]),
    ("mlp_relu", "mlp_relu", []),
])
def test_report_fits_in_120_columns_and_points_to_the_docs(capsys: pytest.CaptureFixture, spec: str, model: str,
                                                          options: list[str]) -> None:
    assert symo.cli.main(["compile", spec, "--model", f"symo.train.models:{model}", "--no-disk-cache", *options]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    assert "docs/theory.md" in out and (REPO / "docs" / "theory.md").exists()
    theory = (REPO / "docs" / "theory.md").read_text()
    for term in ("`nat(s)`", "`std(s)`", "`triv`", "`batch`", "`mult`", "`width`", "`dim`"):
        assert term in theory, term  # every word of the report is explained


def write(tmp_path: Path, name: str, data: bytes | str) -> str:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


ERROR_CASES = {
    "not-utf8-spec": (lambda t: ["compile", write(t, "s.toml", b"\xff\xfe"), "--shapes", "a=2"], 2, "UTF-8"),
    "underdetermined": (lambda t: ["compile", write(t, "s.toml", '[spaces]\na = "perm"\nb = "perm"\n'
                                                    '[params]\nw = ["(a b)"]\n'), "--shapes", "w=6"],
                        2, "cannot infer"),
    "bad-json-shapes": (lambda t: ["compile", "mlp_tanh", "--shapes", write(t, "s.json", "{not json")], 1, "JSON"),
    "json-shapes-list": (lambda t: ["compile", "mlp_tanh", "--shapes", write(t, "s.json", "[1, 2]")], 1, "JSON"),
    "json-shape-str": (lambda t: ["compile", "mlp_tanh", "--shapes", write(t, "s.json", json.dumps({"a": "6"}))],
                       1, "JSON"),
    "factory-raises": (lambda t: ["compile", "mlp_tanh", "--model", "symo.train.models:GPTConfig.__init__"], 1,
                       "--model"),
    "factory-not-a-module": (lambda t: ["params", "--model", "symo.train.models:GPTConfig"], 1, "not an nn.Module"),
    "missing-module": (lambda t: ["params", "--model", "no_such_module_xyz:f"], 1, "no_such_module_xyz"),
    "unknown-bundled-name": (lambda t: ["compile", "gpt_muom", "--model", "symo.train.models:mlp_tanh"], 2, "gpt_muon"),
    "bad-size": (lambda t: ["compile", "gpt", "--model", "symo.train.models:mlp_tanh", "--size", "x"], 2, "--size"),
    "shape-negative": (lambda t: ["compile", "mlp_tanh", "--shapes", "fc1.weight=-3x2"], 1, "negative"),
    "model-no-colon": (lambda t: ["params", "--model", "symo.models"], 2, "--model expects module:factory"),
    "model-empty-module": (lambda t: ["params", "--model", ":f"], 1, "--model ':f'"),
    "size-superscript": (lambda t: ["compile", "gpt", "--model", "symo.train.models:mlp_tanh", "--size", "h=1²"], 2,
                         "--size"),
    "size-twice": (lambda t: ["compile", "gpt", "--model", "symo.train.models:gpt_small", "--size", "head{i}=2",
                              "--size", "head{i}=4"], 2, "--size gives 'head{i}' twice, 2 and 4"),
    "train-lr": (lambda t: ["train", "--lr", "-1"], 2, "--lr must be a positive number"),
    "train-device": (lambda t: ["train", "--device", "nonsense"], 2, "--device nonsense"),
    "equivariance-lr": (lambda t: ["equivariance", "sgd", "--lr", "-1"], 2, "--lr must be a positive number"),
    "optimizer-without-model": (lambda t: ["compile", "mlp_tanh", "--shapes", "a=2", "--optimizer"], 2,
                                "--optimizer needs --model"),
}


@pytest.mark.parametrize("case", ERROR_CASES, ids=list(ERROR_CASES))
def test_cli_errors_have_no_traceback(case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """In-process (a subprocess per case costs a torch import each; test_cache_cli runs the real entry
    point): main() returns the exit status and prints one `error:` line, whatever the error."""
    make, code, needle = ERROR_CASES[case]
    argv = make(tmp_path)
    status = symo.cli.main(argv + (["--no-disk-cache"] if argv[0] == "compile" else []))
    message = capsys.readouterr().err
    assert message.startswith("error: ") and message.count("error:") == 1, message  # one message, one format
    assert status == code, (status, message)
    assert "Traceback" not in message and needle in message, message
    assert len(message) < 700
