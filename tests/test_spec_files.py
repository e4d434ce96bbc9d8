"""Reading spec files: what is not a regular file is refused by its type before any read (a FIFO with
no writer would block for ever, /dev/zero would fill memory), the size bound applies while reading, a
UTF-8 byte order mark is read, and a file or folder named like a bundled spec never hides it silently."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from symo.compiler import SpecShadowWarning
from symo.compiler.parse import MAX_SPEC_BYTES, bundled_specs

import symo

SPEC = 'name = "mine"\n[spaces]\nh = "perm"\n[params]\n"fc1.weight" = ["h", "_"]\n"fc2.weight" = ["_", "h"]\n'


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="POSIX special files")
def test_fifo_and_device_paths_are_refused_at_once(tmp_path: Path) -> None:
    """In a child process with a time and memory limit, so a regression fails instead of hanging or
    exhausting the machine: a FIFO without a writer and /dev/zero each give a SpecError naming the path."""
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    script = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        import symo
        for path in ({str(fifo)!r}, "/dev/zero"):
            try:
                symo.load_spec(path)
            except symo.SpecError as exc:
                print(str(exc).splitlines()[0])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    fifo_line, zero_line = done.stdout.splitlines()
    assert str(fifo) in fifo_line and "FIFO" in fifo_line
    assert "/dev/zero" in zero_line and "device" in zero_line


def test_size_bound_applies_while_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_SPEC_BYTES + 1))
    with pytest.raises(symo.SpecError, match="larger than any spec") as err:
        symo.load_spec(big)
    assert str(big) in str(err.value)
    exact = tmp_path / "exact.toml"
    exact.write_bytes(SPEC.encode() + b"#" * (MAX_SPEC_BYTES - len(SPEC)))
    assert symo.load_spec(exact).name == "mine"  # the bound itself is allowed


def test_a_utf8_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + SPEC.encode())
    assert symo.load_spec(path) == symo.parse_spec(SPEC, source=str(path))
    assert symo.parse_spec("\ufeff" + SPEC).name == "mine"


def test_a_folder_named_like_a_bundled_spec_does_not_hide_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt_muon").mkdir()   # e.g. a run folder: `symo train --out-dir gpt_muon`
    (tmp_path / "mlp_tanh.toml").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert symo.load_spec("gpt_muon").source == str(bundled_specs()["gpt_muon"])
        assert symo.load_spec("mlp_tanh.toml").source == str(bundled_specs()["mlp_tanh"])
    with pytest.raises(symo.SpecError, match="is a folder") as err:
        symo.load_spec("./gpt_muon")  # a path that is explicitly the folder
    assert "gpt_muon" in str(err.value)


def test_a_file_named_like_a_bundled_spec_is_read_with_a_warning(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt_muon.toml").write_text(SPEC)
    with pytest.warns(SpecShadowWarning, match=r"not the bundled spec 'gpt_muon'.*\./gpt_muon\.toml"):
        assert symo.load_spec("gpt_muon.toml").name == "mine"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert symo.load_spec("./gpt_muon.toml").name == "mine"   # explicitly the file: no warning
        assert symo.load_spec("gpt_muon").name != "mine"          # no file of that exact name: bundled


def test_the_bundled_file_itself_is_no_shadow(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the folder that holds the bundled specs (a source checkout's specs/), the name is that file."""
    monkeypatch.chdir(bundled_specs()["gpt_muon"].parent)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert symo.load_spec("gpt_muon.toml").source == "gpt_muon.toml"
