"""Bad input that could reach the generated code, the rest of tests/test_bad_input.py's families: damage to the
compile cache gets a rebuild (never an exception, never running the damaged file), names reach the generated
code only as literals, and pattern matching finishes in linear time on adversarial names.
"""

from __future__ import annotations

import ast
import io
import json
import os
import tokenize
import warnings
from pathlib import Path

import pytest
import symo.compiler as compiler
import torch
from cases import MLP_SPEC
from symo.compiler.cache import DiskCache

import symo

MLP = {"fc1.weight": (3, 2), "fc1.bias": (3,), "fc2.weight": (2, 3), "fc2.bias": (2,)}
GOOD = MLP_SPEC % "signed_perm"


# ---------------------------------------------------------------------------------------------
# Family 6: damage to the cache directory -> a rebuild, never an exception, never running the file
# ---------------------------------------------------------------------------------------------

TANH = "mlp_tanh"
TANH_SHAPES = {"fc1.weight": (16, 8), "fc1.bias": (16,), "fc2.weight": (16, 16), "fc2.bias": (16,),
               "fc3.weight": (4, 16), "fc3.bias": (4,)}


def damage_secret_empty(cache: Path, entry: Path) -> None:
    (cache / ".secret").write_bytes(b"")


def damage_secret_short(cache: Path, entry: Path) -> None:
    (cache / ".secret").write_bytes(b"k")


def damage_secret_dir(cache: Path, entry: Path) -> None:
    (cache / ".secret").unlink()
    (cache / ".secret").mkdir()


def damage_entry_dir(cache: Path, entry: Path) -> None:
    entry.unlink()
    entry.mkdir()


def damage_mac_dir(cache: Path, entry: Path) -> None:
    mac = entry.with_suffix(".mac")
    mac.unlink()
    mac.mkdir()


def damage_mac_unicode(cache: Path, entry: Path) -> None:
    entry.with_suffix(".mac").write_text("\u00e9" * 64, encoding="utf-8")


def damage_entry_not_utf8(cache: Path, entry: Path) -> None:
    entry.write_bytes(b"\xff\xfe" + entry.read_bytes())


def damage_entry_truncated(cache: Path, entry: Path) -> None:
    entry.write_text(entry.read_text()[:100])


def damage_entry_signed_but_broken(cache: Path, entry: Path) -> None:
    """A correctly signed entry that does not load (as from an older codegen): rebuilt."""
    disk = DiskCache(cache)
    source = "raise RuntimeError('stale entry')\n"
    entry.write_text(source)
    entry.with_suffix(".mac").write_bytes(disk._mac(entry.stem, source))


def damage_entry_signed_but_incomplete(cache: Path, entry: Path) -> None:
    disk = DiskCache(cache)
    source = "BLOCKS = []\n"
    entry.write_text(source)
    entry.with_suffix(".mac").write_bytes(disk._mac(entry.stem, source))


CACHE_DAMAGE = [damage_secret_empty, damage_secret_short, damage_secret_dir, damage_entry_dir, damage_mac_dir,
                damage_mac_unicode, damage_entry_not_utf8, damage_entry_truncated, damage_entry_signed_but_broken,
                damage_entry_signed_but_incomplete]


@pytest.mark.parametrize("damage", CACHE_DAMAGE, ids=[d.__name__.removeprefix("damage_") for d in CACHE_DAMAGE])
def test_cache_damage_leads_to_a_rebuild(damage, tmp_path: Path, fresh_memory) -> None:
    cache = tmp_path / "cache"
    first = symo.compile(TANH, TANH_SHAPES, cache_dir=cache)
    entry = first.source_path
    damage(cache, entry)
    fresh_memory()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = symo.compile(TANH, TANH_SHAPES, cache_dir=cache)
    assert again.from_cache == "built" and again.source == first.source
    g = {n: torch.randn(s, dtype=torch.float64) for n, s in TANH_SHAPES.items()}
    back = again.scatter(again.gather(g))
    assert all(torch.allclose(back[n], g[n]) for n in g)


def test_cache_directory_that_is_a_file_compiles_in_memory(tmp_path: Path, fresh_memory) -> None:
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    with pytest.warns(UserWarning, match="unusable"):
        compiled = symo.compile(TANH, TANH_SHAPES, cache_dir=cache)
    assert compiled.from_cache == "built" and compiled.source_path is None


def test_cache_directory_removed_after_first_use(tmp_path: Path, fresh_memory) -> None:
    import shutil

    cache = tmp_path / "cache"
    symo.compile(TANH, TANH_SHAPES, cache_dir=cache)
    shutil.rmtree(cache)
    cache.write_text("now a file")
    fresh_memory()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert symo.compile("mlp_relu", TANH_SHAPES, cache_dir=cache).from_cache == "built"


def test_a_module_that_fails_to_load_is_never_cached(tmp_path: Path, fresh_memory,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(structure, key):
        return compiler.GeneratedCode(key=key, source="def gather(t):\n    return {\n")  # a SyntaxError

    monkeypatch.setattr(compiler, "generate", broken)
    with pytest.raises(RuntimeError, match="does not load"):
        symo.compile(TANH, TANH_SHAPES, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.py")) and not compiler._MEMORY
    monkeypatch.undo()
    fresh_memory()
    assert symo.compile(TANH, TANH_SHAPES, cache_dir=tmp_path / "cache").from_cache == "built"


# ---------------------------------------------------------------------------------------------
# Family 7: names reach the generated code only as literals (the newline-injection attempt)
# ---------------------------------------------------------------------------------------------

HOSTILE_NAMES = [
    'x"]);import os;os.environ["SYMO_PWNED"]="1";#',
    "y'];import os;os.environ['SYMO_PWNED']='1';#",
    "z\\'];__import__('os').environ.__setitem__('SYMO_PWNED','1')#",
    "w'''\"\"\" # not a comment end",
    "caf\u00e9.\u03b1\u03b2",
    "{not_a_capture.x",
]


def test_injection_through_a_newline_is_refused() -> None:
    name = 'fc.w  # x\nimport os; os.environ["SYMO_PWNED"] = "1"\n#'
    with pytest.raises(ValueError, match="control"):
        symo.compile(symo.parse_spec(GOOD), {**MLP, name: (2,)}, disk_cache=False)
    text = '[spaces]\nh = "signed_perm"\n[params]\n' + json.dumps(name) + ' = ["h"]\n'
    with pytest.raises(symo.SpecError, match="not a valid parameter name"):
        symo.parse_spec(text)
    assert "SYMO_PWNED" not in os.environ


def test_hostile_names_are_carried_as_literals_only(tmp_path: Path, fresh_memory) -> None:
    shapes = {name: (3, 2) for name in HOSTILE_NAMES}
    text = '[spaces]\n"h{i}" = "signed_perm"\n[params]\n' + "".join(
        json.dumps(n) + ' = ["_", "_"]\n' for n in HOSTILE_NAMES[:-1])
    # the last name shares a space whose instance name is captured from hostile text
    text += '"cap.{i}" = ["h{i}", "_"]\n'
    shapes['cap.q"];import os;#'] = (3, 2)
    compiled = symo.compile(symo.parse_spec(text), shapes, cache_dir=tmp_path / "cache")
    assert "SYMO_PWNED" not in os.environ
    literals = []
    for tok in tokenize.generate_tokens(io.StringIO(compiled.source).readline):
        if tok.type == tokenize.STRING and not tok.string.startswith("f"):  # the helpers' f-strings hold no names
            literals.append(ast.literal_eval(tok.string))
        if tok.type == tokenize.COMMENT:  # no input text: no quote, no code, nothing non-ASCII
            body = tok.string[1:]
            assert body.isascii() and not any(c in body for c in "\"'#\\{"), tok
            assert not any(word in body for word in ("import", "environ", "PWNED", "caf", "not_a_capture")), tok
        if tok.type == tokenize.NAME:
            assert tok.string.isascii() and tok.string not in ("os", "environ", "__import__", "__setitem__"), tok
    for name in shapes:  # a string literal, or inside the JSON text of a table (compiler.codegen_template)
        if name in compiled.param_names:
            assert any(name == text or json.dumps(name) in text for text in literals), name
    g = {n: torch.randn(s, dtype=torch.float64) for n, s in shapes.items()}
    back = compiled.scatter(compiled.gather(g))
    assert all(torch.allclose(back[n], g[n]) for n in compiled.param_names)
    compiled.orbit_average(g).power(-0.5).matvec(g)


# ---------------------------------------------------------------------------------------------
# Family 8: pattern matching in linear time, and agreeing with a regex on what it accepts
# ---------------------------------------------------------------------------------------------


def test_adversarial_patterns_finish() -> None:
    """A backtracking regex takes time polynomial of degree 8 here; the matcher scans once."""
    pattern = "".join(f"{{c{k}}}x" for k in range(8)) + ".w"
    spec = symo.parse_spec('[spaces]\nh = "perm"\n[params]\n"?' + pattern + '" = ["h"]\n"b" = ["h"]\n')
    names = {"x" * 20000 + ".w": (3,), "x" * 5000 + "y.w": (3,), "b": (3,)}
    compiled = symo.compile(spec, names, disk_cache=False)
    assert compiled.param_names == ["x" * 20000 + ".w", "b"]


@pytest.mark.parametrize("pattern,name,captures", [
    ("fc{i}.weight", "fc12.weight", {"i": "12"}),
    ("layers.{i}.{j}", "layers.3.x", {"i": "3", "j": "x"}),
    ("{a}_{b}", "x_y_z", {"a": "x", "b": "y_z"}),  # leftmost: the first "_" ends {a}
    ("a{x}b{y}b", "a1b2b", {"x": "1", "y": "2"}),
    ("h.{i}.x.{i}", "h.1.x.1", {"i": "1"}),
    ("*.bias", "fc1.bias", {}),
    ("fc*", "fc", {}),
])
def test_pattern_matches(pattern: str, name: str, captures: dict) -> None:
    from symo.compiler.patterns import NamePattern

    m = NamePattern(pattern, "<test>").fullmatch(name)
    assert m is not None and m.groupdict() == captures


@pytest.mark.parametrize("pattern,name", [
    ("fc{i}.weight", "fc.weight"), ("layers.{i}", "layers.1.2"), ("h.{i}.x.{i}", "h.1.x.2"),
    ("a{x}b{y}b", "a1bb"), ("*.bias", "bias"), ("fc1", "fc10"),
])
def test_pattern_does_not_match(pattern: str, name: str) -> None:
    from symo.compiler.patterns import NamePattern

    assert NamePattern(pattern, "<test>").fullmatch(name) is None
