"""Start-up cost without timing: `import symo` and the real `symo --help` / `--version` entry points import
neither sympy nor networkx (nor torch), each checked in a fresh interpreter. The timed comparison with
`import torch` is benchmarks/startup.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("sympy", "networkx", "torch")


def imported_modules(command: list[str]) -> set[str]:
    """Every module `command` imports, read from Python's -X importtime report (PYTHONPROFILEIMPORTTIME,
    which reaches a console script too)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert len(lines) > 10, done.stderr[-2000:]  # the report is there (an empty one would pass vacuously)
    return {line.rsplit("|", 1)[1].strip() for line in lines}


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


@pytest.mark.slow
def test_import_symo_leaves_the_heavy_dependencies_out() -> None:
    modules = imported_modules([sys.executable, "-c", "import symo"])
    assert "symo" in modules and heavy(modules) == []


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_symo_help_and_version_leave_the_heavy_dependencies_out(flag: str) -> None:
    script = Path(sys.executable).with_name("symo")
    for command in ([sys.executable, "-m", "symo", flag], [str(script), flag] if script.is_file() else None):
        if command is None:
            continue
        modules = imported_modules(command)
        assert "symo.cli" in modules and heavy(modules) == [], command
