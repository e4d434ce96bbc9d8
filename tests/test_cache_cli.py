"""The kernel cache (memory and signed disk entries) and the `symo compile` command line.

"A new process" is simulated by emptying `compiler._MEMORY` and `compiler._DISKS` (monkeypatched, so other tests keep
theirs). Every disk cache lives under tmp_path; nothing is written to the user's home.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import symo.compiler as compiler
import torch

import symo
import symo.cli
from symo.train.models import mlp_tanh

REPO = Path(__file__).resolve().parents[1]
TANH = str(REPO / "specs" / "mlp_tanh.toml")
MLP_SHAPES = {"fc1.weight": (16, 8), "fc1.bias": (16,), "fc2.weight": (16, 16), "fc2.bias": (16,),
              "fc3.weight": (4, 16), "fc3.bias": (4,)}
SHAPES_ARG = "fc1.weight=16x8,fc1.bias=16,fc2.weight=16x16,fc2.bias=16,fc3.weight=4x16,fc3.bias=4"


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.py"))


# ---------------------------------------------------------------------------------------------
# Memory and disk
# ---------------------------------------------------------------------------------------------


def test_second_process_loads_from_disk(tmp_path: Path, fresh_memory) -> None:
    first = symo.compile(TANH, MLP_SHAPES, cache_dir=tmp_path)
    assert first.from_cache == "built"
    (entry,) = entries(tmp_path)
    assert first.source_path == entry and entry.read_text() == first.source
    assert (tmp_path / f"{entry.stem}.mac").exists()
    assert symo.compile(TANH, MLP_SHAPES, cache_dir=tmp_path).from_cache == "memory"
    fresh_memory()
    second = symo.compile(TANH, MLP_SHAPES, cache_dir=tmp_path)
    assert second.from_cache == "disk"
    assert second.source == first.source and second.key == first.key
    assert second.param_names == first.param_names and [b.name for b in second.blocks] == [b.name for b in first.blocks]


def test_entries_are_private(tmp_path: Path, fresh_memory) -> None:
    symo.compile(TANH, MLP_SHAPES, cache_dir=tmp_path / "c")
    for f in (tmp_path / "c").iterdir():
        assert f.stat().st_mode & 0o077 == 0, f


def test_tampered_entry_is_rebuilt_and_never_executed(tmp_path: Path, fresh_memory) -> None:
    cache = tmp_path / "cache"
    marker = tmp_path / "EXECUTED"
    first = symo.compile(TANH, MLP_SHAPES, cache_dir=cache)
    (entry,) = entries(cache)
    entry.write_text(f"open({str(marker)!r}, 'w').write('tampered')\n" + first.source)
    fresh_memory()
    with pytest.warns(UserWarning, match="failed verification"):
        again = symo.compile(TANH, MLP_SHAPES, cache_dir=cache)
    assert again.from_cache == "built"
    assert not marker.exists()
    assert again.source == first.source and entry.read_text() == first.source  # the entry is repaired
    fresh_memory()
    assert symo.compile(TANH, MLP_SHAPES, cache_dir=cache).from_cache == "disk"


@pytest.mark.parametrize("damage", ["garbage-text", "garbage-bytes", "other-entry", "missing"])
def test_corrupt_mac_is_rebuilt_and_never_executed(tmp_path: Path, fresh_memory, damage: str) -> None:
    cache = tmp_path / "cache"
    marker = tmp_path / "EXECUTED"
    first = symo.compile(TANH, MLP_SHAPES, cache_dir=cache)
    (entry,) = entries(cache)
    mac = cache / f"{entry.stem}.mac"
    # the payload would run if the entry were trusted
    payload = f"open({str(marker)!r}, 'w').write('x')\n" + first.source
    if damage == "other-entry":  # a valid signature, but of a different source
        other = symo.compile(str(REPO / "specs" / "mlp_relu.toml"), MLP_SHAPES, cache_dir=cache)
        mac.write_bytes((cache / f"{other.key}.mac").read_bytes())
    elif damage == "garbage-text":
        mac.write_text("0" * 64)
    elif damage == "garbage-bytes":  # not even UTF-8: treated as a missing entry
        mac.write_bytes(b"\x00\xffnot a mac")
    else:
        mac.unlink()
    entry.write_text(payload)
    fresh_memory()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = symo.compile(TANH, MLP_SHAPES, cache_dir=cache)
    if damage in ("garbage-text", "other-entry"):
        assert any("failed verification" in str(w.message) for w in caught)
    assert again.from_cache == "built" and again.source == first.source
    assert not marker.exists()


def test_lost_secret_invalidates_entries(tmp_path: Path, fresh_memory) -> None:
    cache = tmp_path / "cache"
    first = symo.compile(TANH, MLP_SHAPES, cache_dir=cache)
    (cache / ".secret").unlink()
    fresh_memory()
    with pytest.warns(UserWarning, match="failed verification"):
        assert symo.compile(TANH, MLP_SHAPES, cache_dir=cache).from_cache == "built"
    fresh_memory()
    again = symo.compile(TANH, MLP_SHAPES, cache_dir=cache)
    assert again.from_cache == "disk" and again.source == first.source


def test_world_writable_cache_dir_is_not_used(tmp_path: Path, fresh_memory) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.warns(UserWarning, match="writable by others"):
        compiled = symo.compile(TANH, MLP_SHAPES, cache_dir=cache)
    assert compiled.from_cache == "built" and compiled.source_path is None
    assert entries(cache) == []


def test_env_var_sets_the_cache_dir(tmp_path: Path, fresh_memory, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "env" / "kernels"
    monkeypatch.setenv("SYMO_CACHE_DIR", str(target))
    assert compiler.default_cache_dir() == target
    compiled = symo.compile(TANH, MLP_SHAPES)
    assert compiled.source_path is not None and compiled.source_path.parent == target
    assert entries(target) == [compiled.source_path]
    fresh_memory()
    assert symo.compile(TANH, MLP_SHAPES).from_cache == "disk"


def test_no_disk_cache_writes_nothing(tmp_path: Path, fresh_memory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYMO_CACHE_DIR", str(tmp_path / "env"))
    compiled = symo.compile(TANH, MLP_SHAPES, disk_cache=False)
    assert compiled.from_cache == "built" and compiled.source_path is None
    assert not (tmp_path / "env").exists()


def test_cache_key_ignores_formatting_and_widths_but_not_layout(tmp_path: Path, fresh_memory) -> None:
    text = Path(TANH).read_text()
    reformatted = "# a comment\n" + text.replace(" = ", "=")
    a = symo.compile(symo.parse_spec(text), MLP_SHAPES, cache_dir=tmp_path)
    b = symo.compile(symo.parse_spec(reformatted), MLP_SHAPES, cache_dir=tmp_path)
    assert a.key == b.key and b.from_cache == "memory"
    # another width: the same generated source (sizes are symbols), bound to the new sizes
    wider = {**MLP_SHAPES, "fc1.weight": (16, 9)}
    c = symo.compile(symo.parse_spec(text), wider, cache_dir=tmp_path)
    assert c.key == a.key and c.from_cache == "memory" and c.source == a.source
    assert len(entries(tmp_path)) == 1
    assert [b.mult for b in c.blocks] != [b.mult for b in a.blocks]  # fc1's 9 columns, not 8
    g = {n: torch.randn(s, dtype=torch.float64) for n, s in wider.items()}
    assert all(torch.equal(x, g[n]) for n, x in c.scatter(c.gather(g)).items())
    # another layout (a parameter the spec now covers differently) is another source
    relu = symo.compile(str(REPO / "specs" / "mlp_relu.toml"), MLP_SHAPES, cache_dir=tmp_path)
    assert relu.key != a.key and relu.from_cache == "built"


def test_uncovered_parameters_are_not_served_stale_from_the_cache(tmp_path: Path, fresh_memory) -> None:
    """Two models that differ only in parameters the spec does not cover must each report their own."""
    extra = {**MLP_SHAPES, "embed.weight": (5, 8)}
    plain = symo.compile(TANH, MLP_SHAPES, cache_dir=tmp_path)
    assert plain.uncovered == {}
    with_extra = symo.compile(TANH, extra, cache_dir=tmp_path)  # memory
    assert with_extra.uncovered == {"embed.weight": (5, 8)}
    assert "embed.weight" in with_extra.describe()
    fresh_memory()
    from_disk = symo.compile(TANH, extra, cache_dir=tmp_path)
    assert from_disk.uncovered == {"embed.weight": (5, 8)}


def test_generated_source_is_inspectable(tmp_path: Path, fresh_memory) -> None:
    spec = symo.load_spec(TANH)
    module = compiler.compile_spec(spec, MLP_SHAPES, cache_dir=tmp_path)
    source = module.source
    assert "def gather(" in source and "def scatter(" in source and "import torch" in source
    assert source.startswith("# Generated by symo")
    assert inspect.getsource(module.namespace["gather"]).startswith("def gather(")
    assert "def scatter(" in inspect.getsource(module.namespace["scatter"])
    compile(source, "<check>", "exec")  # plain Python
    # without a disk cache the source is still registered for tracebacks and inspect
    fresh_memory()
    mem = compiler.compile_spec(spec, MLP_SHAPES, disk_cache=False)
    assert mem.path is None and inspect.getsource(mem.namespace["gather"]).startswith("def gather(")
    # scatter is gather's transpose: a round trip is the identity on covered parameters
    import torch

    t = {n: torch.randn(*s, dtype=torch.float64) for n, s in MLP_SHAPES.items()}
    back = module.namespace["scatter"](module.namespace["gather"](t))
    for n in MLP_SHAPES:
        torch.testing.assert_close(back[n], t[n], rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_module_entry_point(tmp_path: Path) -> None:
    env = {**os.environ, "SYMO_CACHE_DIR": str(tmp_path / "cli-cache")}
    ok = subprocess.run([sys.executable, "-m", "symo", "compile", "specs/mlp_tanh.toml", "--model",
                         "symo.train.models:mlp_tanh", "--no-disk-cache"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    out = ok.stdout
    assert "tanh MLP" in out and "block" in out and "label" in out and "nat(h1)" in out
    assert "memory (numbers)" in out and "(memory only)" in out
    assert "0 uncovered" in out and "uncovered (not" not in out
    assert not (tmp_path / "cli-cache").exists()
    bad = tmp_path / "bad.toml"
    bad.write_text('[spaces]\nh = { group = "permutation" }\n[params]\n"fc1.weight" = ["h", "_"]\n')
    err = subprocess.run([sys.executable, "-m", "symo", "compile", str(bad), "--model", "symo.train.models:mlp_tanh",
                          "--no-disk-cache"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert err.returncode == 2
    assert str(bad) in err.stderr and "spaces.h.group" in err.stderr and "how to fix" in err.stderr
    assert "Traceback" not in err.stderr and err.stdout == ""


def test_cli_shapes_uncovered_and_source(capsys: pytest.CaptureFixture, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch, fresh_memory) -> None:
    monkeypatch.setenv("SYMO_CACHE_DIR", str(tmp_path / "cache"))
    rc = symo.cli.main(["compile", TANH, "--shapes", SHAPES_ARG + ",embed.weight=5x8", "--source"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "1 uncovered" in out and "uncovered (not curvature-preconditioned): embed.weight" in out
    assert "def gather(" in out and "def scatter(" in out
    assert str(tmp_path / "cache") in out  # where the generated code lives
    assert len(entries(tmp_path / "cache")) == 1


def test_cli_shapes_from_json_and_sizes(capsys: pytest.CaptureFixture, tmp_path: Path, fresh_memory) -> None:
    spec = tmp_path / "heads.toml"
    spec.write_text('[spaces]\nhead = "identity"\nd = { group = "orthogonal", per = "head" }\n'
                    '[params]\nq = ["(head d)", "_"]\n')
    shapes = tmp_path / "shapes.json"
    shapes.write_text('{"q": [6, 4]}')
    assert symo.cli.main(["compile", str(spec), "--shapes", str(shapes), "--size", "head=3", "--no-disk-cache"]) == 0
    out = capsys.readouterr().out
    assert "nat(d) per head" in out
    assert symo.cli.main(["compile", str(spec), "--shapes", "q=6x4", "--size", "d=3", "--no-disk-cache"]) == 0
    assert "nat(d) per head" in capsys.readouterr().out


@pytest.mark.parametrize("argv_tail,needle", [
    (["--shapes", "fc1.weight=16x8"], "fc1.bias"),  # the spec's other patterns match nothing
    (["--shapes", SHAPES_ARG, "--size", "nope=3"], "'nope'"),  # a size for a space no parameter uses
])
def test_cli_spec_errors_exit_2(capsys: pytest.CaptureFixture, argv_tail: list[str], needle: str,
                                fresh_memory) -> None:
    assert symo.cli.main(["compile", TANH, *argv_tail, "--no-disk-cache"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and TANH in captured.err and needle in captured.err
    assert "how to fix" in captured.err and captured.out == ""


def test_cli_missing_spec_file_exits_2(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    assert symo.cli.main(["compile", missing, "--shapes", SHAPES_ARG, "--no-disk-cache"]) == 2
    assert missing in capsys.readouterr().err


def test_cli_bad_arguments_exit_nonzero_with_a_message(capsys: pytest.CaptureFixture) -> None:
    for argv in (["compile", TANH, "--shapes", "fc1.weight=16by8", "--no-disk-cache"],
                 ["compile", TANH, "--model", "symo.models", "--no-disk-cache"],
                 ["compile", TANH, "--model", "symo.train.models:no_such_factory", "--no-disk-cache"],
                 ["compile", TANH, "--shapes", SHAPES_ARG, "--size", "h1=three", "--no-disk-cache"]):
        assert symo.cli.main(argv) in (1, 2)
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err) > len("error: \n")  # the message is shown to the user


def test_cli_model_factory_matches_library(capsys: pytest.CaptureFixture, fresh_memory) -> None:
    assert symo.cli.main(["compile", TANH, "--model", "symo.train.models:mlp_tanh", "--no-disk-cache"]) == 0
    out = capsys.readouterr().out
    compiled = symo.compile(TANH, mlp_tanh(), disk_cache=False)
    assert compiled.describe().splitlines()[:-1] == out.splitlines()[:len(compiled.describe().splitlines()) - 1]
