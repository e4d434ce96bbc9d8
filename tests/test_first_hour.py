"""A new user's first hour with the command line: a model module in the current folder, the CLI's
messages, and the options a resumed run takes from its checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
