"""Start-up cost of the command line: `symo --help`, `symo --version` and an argument error of `symo train`
(`symo train --steps -1`, which must answer before torch is imported) against `import torch`.

Each command runs in a fresh interpreter (the one running this script, so the installed package is
what is measured), `--runs` times (default 5, after one untimed warm-up run each that fills the file
system cache); the median wall time is reported, and for `--help`, `--version` and the argument error the
ratio to `python -c "import torch"`. The goal is under 1.15x: none of them imports torch, sympy or networkx.

    python -m benchmarks.startup              # writes benchmarks/results/startup.{md,json}
    python -m benchmarks.startup --runs 11

The times depend on the machine and its load; the script records the load average next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
GOAL = 1.15


def symo_command() -> list[str]:
    """The installed console script beside this interpreter, else `python -m symo` (the same entry point)."""
    script = Path(sys.executable).with_name("symo")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "symo"]


def wall_time(command: list[str], runs: int, status: int = 0) -> float:
    """Median wall time in seconds of `command` (which must exit with `status`) over `runs` runs, after one
    untimed warm-up run."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=RESULTS)
        if done.returncode != status:
            raise RuntimeError(f"{command} exited with {done.returncode}, not {status}")
        if i:  # the first run only warms the file system cache
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(runs: int) -> dict[str, float]:
    python = [sys.executable, "-c"]
    torch_s = wall_time([*python, "import torch"], runs)
    symo_s = wall_time([*python, "import symo"], runs)
    help_s = wall_time([*symo_command(), "--help"], runs)
    version_s = wall_time([*symo_command(), "--version"], runs)
    error_s = wall_time([*symo_command(), "train", "--steps", "-1"], runs, status=2)
    return {"import_torch_s": round(torch_s, 4), "import_symo_s": round(symo_s, 4), "help_s": round(help_s, 4),
            "version_s": round(version_s, 4), "train_arg_error_s": round(error_s, 4),
            "help_x_torch": round(help_s / torch_s, 3), "version_x_torch": round(version_s / torch_s, 3),
            "train_arg_error_x_torch": round(error_s / torch_s, 3)}


def report(result: dict[str, float], runs: int, load: tuple[float, float, float]) -> str:
    torch_s = result["import_torch_s"]
    rows = [("`python -c \"import torch\"`", torch_s, 1.0),
            ("`python -c \"import symo\"`", result["import_symo_s"], result["import_symo_s"] / torch_s),
            ("`symo --help`", result["help_s"], result["help_x_torch"]),
            ("`symo --version`", result["version_s"], result["version_x_torch"]),
            ("`symo train --steps -1` (error, exit 2)", result["train_arg_error_s"], result["train_arg_error_x_torch"])]
    ok = max(result["help_x_torch"], result["version_x_torch"], result["train_arg_error_x_torch"]) < GOAL
    lines = [
        "# Start-up time of the command line",
        "",
        f"`python -m benchmarks.startup`: median wall time of {runs} runs per command, each in a fresh "
        "interpreter (after one untimed warm-up run), and the ratio to `import torch`.",
        "",
        "| command | median wall time (s) | x `import torch` |",
        "|---|---|---|",
        *[f"| {name} | {seconds:.3f} | {ratio:.2f} |" for name, seconds, ratio in rows],
        "",
        f"Goal: `symo --help`, `symo --version` and a `symo train` argument error under {GOAL}x `import torch`: "
        f"{'met' if ok else 'NOT met'}. None of them imports torch, sympy or networkx (tests/test_startup.py "
        "checks that without timing); they pay for the interpreter, argparse and symo's own small modules.",
        "",
        f"Measured on a shared machine ({os.cpu_count()} cores, load average {load[0]:.2f} / {load[1]:.2f} / "
        f"{load[2]:.2f} over 1 / 5 / 15 minutes at the start, other jobs running), so the absolute times are "
        "inflated and noisy; the ratios are the comparison.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command (median reported)")
    args = parser.parse_args()
    load = os.getloadavg()
    result = measure(args.runs)
    text = report(result, args.runs, load)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "startup.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
