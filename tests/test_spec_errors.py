"""Bad specs: every mistake raises one `symo.SpecError` that says where it is and how to fix it.

Each case is written to a real file (so the message must name that file), compiled against plain
shapes, and the error is checked for: the file, the TOML key, the parameter and/or axis where the
mistake concerns one, a reason naming the culprit, and a non-empty hint. A failed compile caches
nothing, in memory or on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import symo.compiler as compiler

import symo

MLP_SHAPES = {"fc1.weight": (3, 2), "fc1.bias": (3,), "fc2.weight": (2, 3), "fc2.bias": (2,)}
GOOD_SPACES = '[spaces]\nh = { group = "perm" }\n'


@dataclass(frozen=True)
class Bad:
    id: str
    text: str
    shapes: dict = field(default_factory=lambda: dict(MLP_SHAPES))
    key: str | None = None  # the TOML key the error must name (exact `SpecError.key`)
    param: str | None = None  # the parameter, where the mistake concerns one
    axis: int | None = None  # the axis, where the mistake concerns one
    words: tuple[str, ...] = ()  # case-insensitive substrings the message must contain
    sizes: dict | None = None


BAD = [
    Bad("optional-marker-alone", GOOD_SPACES + '[params]\n"fc1.weight" = ["h", "_"]\n"?" = ["h", "_"]\n',
        key="params.'?'", words=("optional-rule marker", "no pattern")),
    Bad("toml-syntax", '[spaces]\nh = { group = "perm" \n[params]\n"fc1.weight" = ["h", "_"]\n',
        words=("TOML", "line 2")),
    Bad("unknown-group", '[spaces]\nh = { group = "permutation" }\n[params]\n"fc1.weight" = ["h", "_"]\n',
        key="spaces.h.group", words=("permutation", "signed_perm")),
    Bad("undeclared-space", GOOD_SPACES + '[params]\n"fc1.weight" = ["k", "_"]\n',
        key="params.'fc1.weight'", param="fc1.weight", axis=0, words=("'k'", "not declared")),
    Bad("shared-space-two-lengths", GOOD_SPACES + '[params]\n"fc1.weight" = ["h", "_"]\n"fc2.weight" = ["h", "_"]\n',
        key="params.'fc2.weight'", param="fc2.weight", axis=0, words=("inconsistent", "h=3", "length 2")),
    Bad("declared-size-disagrees", '[spaces]\nh = { group = "perm", size = 5 }\n[params]\n"fc1.bias" = ["h"]\n',
        key="params.'fc1.bias'", param="fc1.bias", axis=0, words=("h=5", "length 3")),
    Bad("per-owner-missing",
        '[spaces]\nd = { group = "orthogonal", per = "head" }\n[params]\n"fc1.weight" = ["d", "_"]\n',
        key="spaces.d.per", param="fc1.weight", axis=0, words=("'head'", "not declared")),
    Bad("per-owner-orthogonal",
        '[spaces]\nhead = { group = "orthogonal", size = 1 }\nd = { group = "orthogonal", per = "head" }\n'
        '[params]\n"fc1.weight" = ["(head d)", "_"]\n',
        key="spaces.d.per", words=("'head'", "'orthogonal'", "identity", "perm")),
    Bad("per-space-without-owner-in-block",
        '[spaces]\nhead = { group = "identity", size = 3 }\nd = { group = "orthogonal", per = "head" }\n'
        '[params]\n"fc1.weight" = ["d", "_"]\n"fc1.bias" = ["head"]\n',
        key="params.'fc1.weight'", param="fc1.weight", words=("per 'head'", "(head d)")),
    Bad("axis-count", GOOD_SPACES + '[params]\n"fc1.weight" = ["h"]\n',
        key="params.'fc1.weight'", param="fc1.weight", words=("1 axes", "(3, 2)")),
    Bad("segment-split-overflows",
        '[spaces]\nh = { group = "perm", size = 5 }\n[params]\n"fc1.weight" = [["h", "_"], "_"]\n',
        key="params.'fc1.weight'", param="fc1.weight", axis=0, words=("length 3", "size(_)")),
    Bad("segment-split-does-not-add-up",
        '[spaces]\na = { group = "perm", size = 2 }\nb = { group = "signed_perm", size = 2 }\n'
        '[params]\n"fc1.bias" = [["a", "b"]]\n',
        key="params.'fc1.bias'", param="fc1.bias", axis=0, words=("a=2 + b=2", "length 3")),
    Bad("size-not-inferable",
        '[spaces]\na = { group = "perm" }\nb = { group = "perm" }\n[params]\n"fc1.bias" = ["(a b)"]\n',
        key="params.'fc1.bias'", param="fc1.bias", axis=0, words=("cannot infer",)),
    Bad("pattern-matches-nothing", GOOD_SPACES + '[params]\n"fc1.weight" = ["h", "_"]\n"fc9.wieght" = ["h", "_"]\n',
        key="params.'fc9.wieght'", words=("matches no parameter", "fc1.weight")),
    Bad("parameter-matches-two-rules",
        GOOD_SPACES + '[params]\n"fc{i}.weight" = ["_", "_"]\n"fc1.weight" = ["h", "_"]\n',
        key="params.'fc{i}.weight'", param="fc1.weight", words=("several rules", "'fc1.weight'")),
    Bad("repeated-space-thrice", '[spaces]\nh = { group = "signed_perm" }\n[params]\n"T" = ["h", "(h h)"]\n',
        shapes={"T": (3, 9)}, key="params.'T'", param="T", words=("at most twice", "3 times", "'h'")),
    Bad("capture-not-in-pattern", '[spaces]\n"h{i}" = { group = "perm" }\n[params]\n"fc1.weight" = ["h{i}", "_"]\n',
        key="params.'fc1.weight'", param="fc1.weight", axis=0, words=("{i}", "not captured")),
    Bad("per-capture-not-in-space-name",
        '[spaces]\n"head{i}" = "identity"\n"d{i}" = { group = "orthogonal", per = "head{j}" }\n'
        '[params]\n"fc{i}.weight" = ["(head{i} d{i})", "_"]\n',
        shapes={"fc1.weight": (4, 2)}, key="spaces.d{i}.per", param="fc1.weight", axis=0,
        words=("{j}", "not captured")),
    Bad("unknown-top-level-key", GOOD_SPACES + '[parms]\n"fc1.weight" = ["h", "_"]\n',
        key="parms", words=("unknown", "'parms'", "params")),
    Bad("unknown-space-field", '[spaces]\nh = { group = "perm", sise = 3 }\n[params]\n"fc1.bias" = ["h"]\n',
        key="spaces.h", words=("sise", "size")),
    Bad("bad-size", '[spaces]\nh = { group = "perm", size = 0 }\n[params]\n"fc1.bias" = ["h"]\n',
        key="spaces.h.size", words=("positive integer",)),
    Bad("free-inside-product", GOOD_SPACES + '[params]\n"fc1.bias" = ["(h _)"]\n',
        key="params.'fc1.bias'", param="fc1.bias", axis=0, words=("'_' inside a product",)),
    Bad("unbalanced-parentheses", GOOD_SPACES + '[params]\n"fc1.weight" = ["_", "(h"]\n',
        key="params.'fc1.weight'", param="fc1.weight", axis=1, words=("unbalanced",)),
    Bad("axis-entry-not-a-string", GOOD_SPACES + '[params]\n"fc1.weight" = ["h", 3]\n',
        key="params.'fc1.weight'", param="fc1.weight", axis=1, words=("must be a string",)),
    Bad("param-entry-not-a-list", GOOD_SPACES + '[params]\n"fc1.bias" = "h"\n',
        key="params.'fc1.bias'", param="fc1.bias", words=("non-empty list",)),
    Bad("no-params", GOOD_SPACES, key="params", words=("no [params]",)),
    Bad("size-for-unknown-space", GOOD_SPACES + '[params]\n"fc1.bias" = ["h"]\n',
        key="spaces.zz", words=("'zz'",), sizes={"zz": 4}),
]


def compile_file(tmp_path: Path, bad: Bad, **kwargs) -> symo.CompiledSpec:
    path = tmp_path / "bad_spec.toml"
    path.write_text(bad.text, encoding="utf-8")
    return symo.compile(path, bad.shapes, sizes=bad.sizes, **kwargs)


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_spec_raises_one_located_spec_error(tmp_path: Path, bad: Bad) -> None:
    with pytest.raises(symo.SpecError) as info:
        compile_file(tmp_path, bad, disk_cache=False)
    err = info.value
    text = str(err)
    path = str(tmp_path / "bad_spec.toml")
    assert err.file == path and path in text, text
    assert err.key == bad.key, text
    if bad.key is not None:
        assert f"key {bad.key!r}" in text
    assert err.param == bad.param, text
    if bad.param is not None:
        assert f"parameter {bad.param!r}" in text
    assert err.axis == bad.axis, text
    if bad.axis is not None:
        assert f"axis {bad.axis}" in text
    for word in bad.words:
        assert word.lower() in text.lower(), (word, text)
    assert err.hint and "how to fix:" in text and text.rstrip().endswith(err.hint.rstrip()), text
    assert isinstance(err, ValueError)  # SpecError is a ValueError: `except ValueError` still catches it


def test_missing_spec_file_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(symo.SpecError) as info:
        symo.compile(path, MLP_SHAPES, disk_cache=False)
    assert info.value.file == str(path) and info.value.hint


def test_parse_spec_reports_the_source_name() -> None:
    with pytest.raises(symo.SpecError) as info:
        symo.parse_spec('[spaces]\nh = { group = "rotation" }\n[params]\nw = ["h"]\n', source="my/model.toml")
    assert info.value.file == "my/model.toml" and "my/model.toml" in str(info.value)


@pytest.mark.parametrize("bad", [b for b in BAD if b.id in {
    "toml-syntax", "unknown-group", "shared-space-two-lengths", "per-owner-missing", "repeated-space-thrice",
    "pattern-matches-nothing", "segment-split-does-not-add-up"}], ids=lambda b: b.id)
def test_failed_compile_caches_nothing(tmp_path: Path, bad: Bad, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SYMO_CACHE_DIR", str(tmp_path / "env-cache"))
    memory_before = dict(compiler._MEMORY)
    with pytest.raises(symo.SpecError):
        compile_file(tmp_path, bad, cache_dir=cache)
    with pytest.raises(symo.SpecError):  # and the default (environment) cache directory too
        compile_file(tmp_path, bad)
    for d in (cache, tmp_path / "env-cache"):
        assert not d.exists() or not list(d.glob("*.py")) and not list(d.glob("*.mac"))
    assert compiler._MEMORY == memory_before


def test_good_spec_after_a_failure_compiles(tmp_path: Path) -> None:
    bad = next(b for b in BAD if b.id == "shared-space-two-lengths")
    with pytest.raises(symo.SpecError):
        compile_file(tmp_path, bad, cache_dir=tmp_path / "cache")
    fixed = Bad("fixed", GOOD_SPACES + '[params]\n"fc1.weight" = ["h", "_"]\n"fc2.weight" = ["_", "h"]\n')
    compiled = compile_file(tmp_path, fixed, cache_dir=tmp_path / "cache")
    assert compiled.param_names == ["fc1.weight", "fc2.weight"]
    assert list(compiled.uncovered) == ["fc1.bias", "fc2.bias"]
    assert len(list((tmp_path / "cache").glob("*.py"))) == 1


def test_a_bundled_spec_that_does_not_fit_points_to_symo_infer(tmp_path: Path) -> None:
    """The bundled Muon spec names symo.models.MLP's `fc{i}`; on a model of one's own the error says how
    to get a spec that fits (symo infer, --relax muon for the Muon-style one). A copy of the same spec
    outside the package is a user's own spec: the hint is not given there."""
    shapes = {"encoder.weight": (4, 3), "decoder.weight": (3, 4)}
    with pytest.raises(symo.SpecError) as err:
        symo.compile("muon", shapes, disk_cache=False)
    assert "symo infer --relax muon" in str(err.value) and "'muon'" in str(err.value)
    mine = tmp_path / "mine.toml"
    mine.write_text(symo.compiler.parse.bundled_specs()["muon"].read_text())
    with pytest.raises(symo.SpecError) as err:
        symo.compile(mine, shapes, disk_cache=False)
    assert "symo infer" not in str(err.value)
    # what the hint recommends covers that model's hidden matrix (Muon leaves the first and last layer out)
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential()
    for i, (name, layer) in enumerate([("encoder", torch.nn.Linear(3, 4)), ("hidden", torch.nn.Linear(4, 4)),
                                       ("decoder", torch.nn.Linear(4, 3))]):
        model.add_module(name, layer)
        model.add_module(f"act{i}", torch.nn.Tanh())
    spec = symo.infer_spec(model, (torch.randn(2, 3),), relax="muon")
    assert symo.compile(spec, model, disk_cache=False).param_names == ["hidden.weight"]


def test_misspelt_keys_groups_and_bundled_names_are_told_the_nearest() -> None:
    cases = {'[spaces]\nh = { gruop = "perm" }\n': "key 'spaces.h': unknown field(s) ['gruop'] (did you mean 'group'?)",
             '[spaces]\nh = { group = "prem" }\n': "unknown group 'prem' (did you mean 'perm'?)",
             'nmae = "x"\n[spaces]\n': "unknown top-level key(s) ['nmae'] (did you mean 'name'?)"}
    for text, message in cases.items():
        with pytest.raises(compiler.SpecError) as err:
            compiler.parse_spec(text)
        assert message in str(err.value)
    with pytest.raises(compiler.SpecError, match=r"cannot read the spec file .*\(did you mean 'gpt_muon_qkv'\?\)"):
        compiler.load_spec("gpt_muon_qvk")
    with pytest.raises(compiler.SpecError) as err:
        compiler.parse_spec('[spaces]\nh = { group = "lie" }\n')
    assert "did you mean" not in str(err.value)


def test_a_space_written_literally_that_two_families_name_is_refused() -> None:
    text = ('[spaces]\n"mlp{i}" = "perm"\n"mlp_gate{i}" = "signed_perm"\n[params]\n'
            '"h.{i}.gate" = ["mlp_gate0", "_"]\n')
    with pytest.raises(compiler.SpecError, match=r"space 'mlp_gate0' is an instance of several families: "
                                                 r"\['mlp\{i\}', 'mlp_gate\{i\}'\]"):
        compiler.bind(compiler.parse_spec(text), {"h.0.gate": (3, 2)})
