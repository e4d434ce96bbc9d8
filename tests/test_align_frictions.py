"""What a user of `symo.align` / `symo align` ran into, each checked as the user meets it: the reason a spec
is refused, activation matching on `nn.MultiheadAttention`, the report's "last changed" column, the note
when the symmetry check cannot run, the flags the messages suggest, the sweep limit, the progress bar
in a log file, and docs/align.md's snippets."""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from cases import gpt_checkpoints, relu_mlp_pair
from helpers import inverse_element
from torch import nn

import symo
from symo.alignment import AlignError, align
from symo.alignment.matching import weight_matching
from symo.cli import main
from symo.train.models import GPT, MLP, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread_module")

REPO = Path(__file__).resolve().parents[1]
HEAD_SIZES = {"dqk{i}": 16, "dvo{i}": 16}

USER_MODELS = '''
from torch import nn

from symo.train.models import MLP


def conv():
    """A classifier for 1 x 28 x 28 images: the guessed input (32 x 32) does not fit its last layer."""
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3), nn.Flatten(), nn.Linear(2 * 24 * 24, 10))


def mlp_no_bias():
    return MLP((8, 16, 16, 4), act="relu", bias=False)
'''

CONV_SPEC = '''name = "conv channels"

[spaces]
c = { group = "perm" }

[params]
"0.weight" = ["c", "_", "_", "_"]
"0.bias" = ["c"]
"2.weight" = ["_", "c", "_", "_"]
'''


@pytest.fixture
def user_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's own models in the current folder (as `--model mymodels:factory` finds it)."""
    name = f"align_user_models_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(USER_MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def _save_pair(tmp_path: Path, factory) -> list[str]:
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = tmp_path / f"m{seed}.pt"
        torch.save(factory().state_dict(), path)
        paths.append(str(path))
    return paths


def _perm_heads_spec(tmp_path: Path) -> Path:
    text = (REPO / "specs" / "gpt_true.toml").read_text()
    assert '"head{i}" = { group = "identity" }' in text
    path = tmp_path / "perm_heads.toml"
    path.write_text(text.replace('"head{i}" = { group = "identity" }', '"head{i}" = { group = "perm" }'))
    return path


# ---------------------------------------------------------------- a head owner that permutes heads
def test_a_perm_head_owner_compiles_and_aligns_a_gpt(tmp_path: Path) -> None:
    """`head{i}` declared perm (heads permuted as wholes, each with its own rotations) once was refused; now the
    spec compiles and align moves the heads: the aligned copy computes the other model's function."""
    spec = _perm_heads_spec(tmp_path)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=11, block_size=8)
    torch.manual_seed(0)
    a, b = GPT(cfg), GPT(cfg)
    compiled = symo.compile(spec, a, sizes=HEAD_SIZES)
    assert compiled.spaces["head0"] == {"group": "perm", "size": 2, "per": None}
    result = align(a, b, spec, sizes=HEAD_SIZES, example_inputs=torch.randint(0, 11, (2, 8)))
    assert not result.relaxed  # the perm owner is checked as a true symmetry of the GPT
    assert result.elements["head0"].shape == (2,) and result.elements["dqk0"].shape == (2, 16, 16)
    assert result.objective_after >= result.objective_before
    ids = torch.randint(0, 11, (2, 8))
    torch.testing.assert_close(result.model(ids), b(ids), atol=1e-5, rtol=1e-5)


def test_cli_aligns_with_a_perm_head_owner(tmp_path: Path, capsys) -> None:
    paths, _ = gpt_checkpoints(tmp_path)
    out = tmp_path / "out.pt"
    args = ["align", *paths, "--spec", str(_perm_heads_spec(tmp_path)), "--size", "dqk{i}=16", "--size", "dvo{i}=16",
            "--no-progress", "-o", str(out)]
    assert main(args) == 0
    report = capsys.readouterr().out
    assert re.search(r"head0\s+perm\s", report) and "dqk0" in report
    assert out.exists()


# ---------------------------------------------------------------- activation matching on nn.MultiheadAttention
class Attention(nn.Module):
    """Embedding -> nn.MultiheadAttention -> ReLU MLP, residual; `keywords`: the attention called with
    query=, key=, value= and sequence-first tensors."""

    def __init__(self, keywords: bool = False) -> None:
        super().__init__()
        self.keywords = keywords
        self.emb = nn.Embedding(11, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=not keywords)
        self.fc1, self.fc2, self.out = nn.Linear(16, 32), nn.Linear(32, 16), nn.Linear(16, 11)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        if self.keywords:
            x = x.transpose(0, 1)
            x = (x + self.attn(query=x, key=x, value=x, need_weights=False)[0]).transpose(0, 1)
        else:
            x = x + self.attn(x, x, x, need_weights=False)[0]
        return self.out(x + self.fc2(torch.relu(self.fc1(x))))

    def example_inputs(self) -> tuple[torch.Tensor]:
        return (torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0)),)


def _tokens(n: int = 8) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 11, (4, 5), generator=gen) for _ in range(n)]


@pytest.mark.parametrize("keywords", [False, True], ids=["positional", "keywords"])
def test_activation_matching_on_multihead_attention_untrained(keywords: bool) -> None:
    torch.manual_seed(0)
    ref = Attention(keywords)
    torch.manual_seed(1)
    other = Attention(keywords)
    result = align(ref, other, method="activations", data=_tokens(3))
    assert {s.name for s in result.spaces} == {"res", "head", "dqk", "dvo", "fc1"}, result.report()
    x = _tokens(1)[0]
    assert torch.allclose(result.model(x), other(x), atol=1e-5)


@pytest.mark.parametrize("keywords", [False, True], ids=["positional", "keywords"])
def test_activation_matching_aligns_a_moved_multihead_attention_model_back(keywords: bool) -> None:
    """Every space, the attention's per-head dqk and dvo included, located in the forward pass and found exactly."""
    torch.manual_seed(0)
    ref = Attention(keywords).double()
    compiled = symo.compile(symo.infer_spec(ref), ref)
    g = compiled.random_element(torch.Generator().manual_seed(5), dtype=torch.float64)
    moved = compiled.act(g, {n: p.detach() for n, p in ref.named_parameters()})
    torch.manual_seed(0)
    other = Attention(keywords).double()
    with torch.no_grad():
        for n, p in other.named_parameters():
            p.copy_(moved[n])
    result = align(ref, other, compiled, method="activations", data=_tokens())
    assert {s.method for s in result.spaces} == {"activations"}, result.report()
    inverses = inverse_element(compiled, g)  # the heads are permuted as wholes: a wreath product
    for s, info in compiled.spaces.items():
        if info["group"] != "identity":
            assert torch.allclose(result.matrices[s], inverses[s], atol=1e-8), s


# ---------------------------------------------------------------- the report's "last changed" column
def _identity(m: torch.Tensor) -> bool:
    return bool(torch.equal(m, torch.eye(m.shape[-1], dtype=m.dtype).expand_as(m)))


def _last_changed(report: str, space: str) -> str:
    line = next(x for x in report.splitlines() if x.split()[:1] == [space])
    return re.split(r"\s{2,}", line.strip())[-1]


def test_the_report_shows_a_dash_only_for_the_identity() -> None:
    """Pairs whose best run starts from the solo start with a space no sweep changes: that space is not
    the identity, and the report says which start set it."""
    seen = 0
    for seed in range(1, 11):
        a, b = relu_mlp_pair(seed)
        result = align(a, b, "mlp_relu", check=False)
        report = result.report()
        for s in result.spaces:
            column = _last_changed(report, s.name)
            if s.last_changed:
                assert column == f"sweep {s.last_changed}", report
            elif _identity(result.matrices[s.name]):
                assert column == "-", report
            else:
                seen += 1
                assert column == f"{result.start} start" and not s.identity, report
    assert seen, "no pair whose best start set a space that no sweep changed"


def test_the_report_names_activation_matching_for_the_spaces_it_set() -> None:
    torch.manual_seed(0)
    ref = Attention()
    torch.manual_seed(1)
    result = align(ref, Attention(), method="activations", data=_tokens(3))
    report = result.report()
    for s in result.spaces:  # a space that kept the identity (the heads left in place) shows "-"
        expected = "-" if _identity(result.matrices[s.name]) else "activations"
        assert _last_changed(report, s.name) == expected, report


# ---------------------------------------------------------------- the model's input, when the guess does not fit
def test_cli_says_how_to_give_the_input_when_the_guess_does_not_fit(tmp_path: Path, user_models: str,
                                                                      capsys) -> None:
    a, b = _save_pair(tmp_path, lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3),
                                                      nn.Flatten(), nn.Linear(2 * 24 * 24, 10)))
    (tmp_path / "conv.toml").write_text(CONV_SPEC)
    base = ["align", a, b, "--model", f"{user_models}:conv", "--no-progress", "-o", str(tmp_path / "out.pt")]
    assert main([*base, "--spec", "conv.toml"]) == 0
    out = capsys.readouterr().out
    assert "symmetry not checked" in out and "--input-shape" in out and "example_inputs" in out
    assert main([*base, "--spec", "conv.toml", "--input-shape", "2x1x28x28"]) == 0
    captured = capsys.readouterr()
    assert "symmetry not checked" not in captured.out and "warning" not in captured.err
    assert main(base) == 2  # spec inferred: the model must run
    assert "--input-shape" in capsys.readouterr().err
    assert main([*base, "--input-shape", "2x1x28x28"]) == 0
    assert "spec inferred" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*base, "--input-shape", "2x1xa"])
    assert "expected dimensions joined by x" in capsys.readouterr().err


# ---------------------------------------------------------------- --partial, as the compiler's hint says
def test_cli_partial_is_the_flag_the_hint_names(tmp_path: Path, user_models: str, capsys) -> None:
    a, b = _save_pair(tmp_path, lambda: MLP((8, 16, 16, 4), act="relu", bias=False))
    out = tmp_path / "out.pt"
    args = ["align", a, b, "--model", f"{user_models}:mlp_no_bias", "--spec", "mlp_relu", "--no-progress",
            "-o", str(out)]
    assert main(args) == 2
    assert "(CLI: --partial)" in capsys.readouterr().err and not out.exists()
    assert main([*args, "--partial"]) == 0
    aligned, original = MLP((8, 16, 16, 4), act="relu", bias=False), MLP((8, 16, 16, 4), act="relu", bias=False)
    aligned.load_state_dict(torch.load(out, weights_only=True))
    original.load_state_dict(torch.load(b, weights_only=True))
    x = torch.randn(5, 8)
    assert torch.allclose(aligned(x), original(x), atol=1e-5)
    merged = tmp_path / "merged.pt"
    assert main(["merge", *args[1:-1], str(merged), "--partial"]) == 0 and merged.exists()


def test_strict_false_drops_the_rules_that_match_nothing() -> None:
    torch.manual_seed(0)
    a = MLP((8, 16, 16, 4), act="relu", bias=False)
    torch.manual_seed(1)
    b = MLP((8, 16, 16, 4), act="relu", bias=False)
    with pytest.raises(symo.SpecError, match="pass strict=False"):
        align(a, b, "mlp_relu")
    result = align(a, b, "mlp_relu", strict=False)
    assert [s.name for s in result.spaces] == ["h1", "h2"] and not result.relaxed


# ---------------------------------------------------------------- the sweep limit
def _pair() -> tuple[MLP, MLP]:
    torch.manual_seed(0)
    a = MLP((8, 16, 16, 4), act="relu")
    torch.manual_seed(1)
    return a, MLP((8, 16, 16, 4), act="relu")


def test_the_result_says_when_the_sweeps_ran_out() -> None:
    a, b = _pair()
    full = align(a, b, "mlp_relu")
    assert full.converged and full.sweeps > 1 and "not converged" not in full.report()
    cut = align(a, b, "mlp_relu", max_sweeps=1)
    assert not cut.converged and cut.sweeps == 1
    assert "1 sweep (the limit, not converged)" in cut.report()
    assert any("max_sweeps=1" in n for n in cut.notes)


def test_cli_warns_when_the_sweeps_ran_out(tmp_path: Path, capsys) -> None:
    a, b = _save_pair(tmp_path, lambda: MLP((8, 16, 16, 4), act="relu"))
    base = [a, b, "--model", "symo.train.models:mlp_relu", "--spec", "mlp_relu", "--no-progress"]
    assert main(["align", *base, "-o", str(tmp_path / "out.pt")]) == 0
    assert "sweep limit" not in capsys.readouterr().err
    for command in ("align", "merge"):
        assert main([command, *base, "--max-sweeps", "1", "-o", str(tmp_path / "out.pt")]) == 0
        err = capsys.readouterr().err
        assert "warning: the alignment stopped at the sweep limit (--max-sweeps 1)" in err, (command, err)


# ---------------------------------------------------------------- the progress bar
def test_cli_draws_no_progress_bar_into_a_log_file(tmp_path: Path, capsys) -> None:
    a, b = _save_pair(tmp_path, lambda: MLP((8, 16, 16, 4), act="relu"))
    assert main(["align", a, b, "--model", "symo.train.models:mlp_relu", "--spec", "mlp_relu",
                 "-o", str(tmp_path / "out.pt")]) == 0
    err = capsys.readouterr().err
    assert "space" not in err and "\r" not in err, err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_counts_the_spaces_of_a_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _pair()
    compiled = symo.compile("mlp_relu", a)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    ref = {n: p.detach() for n, p in a.named_parameters()}
    other = {n: p.detach() for n, p in b.named_parameters()}
    weight_matching(compiled, ref, other, progress=True)
    counts = [(int(k), int(n)) for k, n in re.findall(r"(\d+)/(\d+) \[", terminal.getvalue())]
    assert counts and {n for _, n in counts} == {2}, terminal.getvalue()
    assert all(k <= n for k, n in counts), terminal.getvalue()


# ---------------------------------------------------------------- docs/align.md
def test_docs_link_the_spec_guide_and_the_merge_line_is_whole() -> None:
    text = (REPO / "docs" / "align.md").read_text(encoding="utf-8")
    assert "](specs.md)" in text
    merge = next(line for line in text.splitlines() if line.startswith("symo merge"))
    assert merge.rstrip().endswith(")"), merge


def test_docs_merging_snippet_shows_what_alignment_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys) -> None:
    text = (REPO / "docs" / "align.md").read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", text, re.S)[1]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/align.md[1]", "exec"), {"__name__": "__snippet__"})
    out = capsys.readouterr().out
    found = re.search(r"barrier ([\d.]+) before aligning, ([\d.]+) after", out)
    assert found, out
    before, after = map(float, found.groups())
    assert before > 0.01 and after < before / 3, out


@pytest.mark.parametrize("option, value", [("restarts", -1), ("restarts", 1.5), ("max_sweeps", 0), ("restarts", True)])
def test_search_options_are_validated(option: str, value: object) -> None:
    torch.manual_seed(0)
    a, b = MLP((4, 6, 3)), MLP((4, 6, 3))
    with pytest.raises(AlignError, match=f"{option} must be an integer"):
        align(a, b, "mlp_relu", check=False, **{option: value})
