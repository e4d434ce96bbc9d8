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


def imported_modules(command: list[str], status: int = 0) -> set[str]:
    """Every module `command` imports, read from Python's -X importtime report (PYTHONPROFILEIMPORTTIME,
    which reaches a console script too); the command must exit with `status`."""
    modules, _ = run_with_imports(command, status)
    return modules


def run_with_imports(command: list[str], status: int = 0) -> tuple[set[str], str]:
    """(the modules `command` imports, the rest of its stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == status, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert len(lines) > 10, done.stderr[-2000:]  # the report is there (an empty one would pass vacuously)
    rest = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
    return {line.rsplit("|", 1)[1].strip() for line in lines}, rest


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


@pytest.mark.parametrize("args,names", [
    (["--steps", "-1"], "--steps"),
    (["--bogus"], "--bogus"),
    (["--seed", str(2**70)], "--seed"),
    (["--lr", "1e300"], "--lr"),
    (["--n-embd", "100", "--n-head", "3"], "--n-head"),
    (["--optimizer", "adamw", "--spec", "gpt_true"], "--spec"),
    (["--optimizer", "adamw", "--adamw-lr", "1e-3"], "--adamw-lr"),
])
def test_train_argument_errors_are_printed_before_torch_is_imported(args: list[str], names: str) -> None:
    """A bad `symo train` option is one `error:` line naming it, exit status 2, and neither torch nor sympy is
    imported first (torch alone takes 2 to 9 s to import on a busy machine)."""
    modules, stderr = run_with_imports([sys.executable, "-m", "symo", "train", *args], status=2)
    assert heavy(modules) == [], stderr
    assert "error:" in stderr and names in stderr and "Traceback" not in stderr, stderr
