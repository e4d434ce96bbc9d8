"""Summarise a mutmut run (scripts/mutation.sh) into benchmarks/results/mutation.{md,json}.

Per mutated file: how many mutants the tests killed (a timeout counts as killed: the tests noticed), the
total, and every survivor with its diff and the reason it is harmless, read from
benchmarks/mutation_survivors.json ({mutant name: reason}); a survivor without a reason is marked
"UNEXPLAINED".

    python -m benchmarks.mutation_report --workdir /tmp/symo-mutation --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

# the files mutmut mutates (pyproject.toml [tool.mutmut] only_mutate): the optimizer package and linalg
MUTMUT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["tool"]["mutmut"]
FILES = MUTMUT["only_mutate"]
KILLED = {1: "killed", 3: "killed", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout"}
COMMAND = "bash scripts/mutation.sh   # then: bash scripts/mutation.sh --rerun-survivors"
SAMPLED_COMMAND = "bash scripts/mutation.sh --sample {n}   # then: bash scripts/mutation.sh --rerun-survivors"


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a binomial proportion k / n (the kill rate of a random sample)."""
    if n == 0:
        return 0.0, 1.0
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / d
    return mid - half, mid + half


def status(code) -> str:
    if code in KILLED:
        return KILLED[code]
    return {0: "survived", None: "not checked", 5: "no tests", 33: "no tests", 34: "skipped"}.get(code, "suspicious")


def diff_of(workdir: Path, name: str) -> str:
    out = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=workdir, capture_output=True,
                         text=True, timeout=120).stdout
    lines = [ln for ln in out.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return " / ".join(ln.strip() for ln in lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/symo-mutation"))
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    reasons = json.loads((Path(__file__).parent / "mutation_survivors.json").read_text())
    summary, md = {}, []
    rows = []
    sample_file = args.workdir / "sample.txt"
    sample = set(sample_file.read_text().split()) if sample_file.exists() else None
    for f in FILES:
        meta = json.loads((args.workdir / "mutants" / f"{f}.meta").read_text())
        in_file = len(meta["exit_code_by_key"])
        codes = {k: v for k, v in meta["exit_code_by_key"].items() if sample is None or k in sample}
        counts: dict[str, int] = {}
        for code in codes.values():
            counts[status(code)] = counts.get(status(code), 0) + 1
        survivors = []
        for name, code in sorted(codes.items(), key=lambda kv: _natural(kv[0])):
            st = status(code)
            if st in ("killed", "timeout"):
                continue
            survivors.append({"mutant": name, "status": st, "diff": diff_of(args.workdir, name),
                              "reason": reasons.get(name, "UNEXPLAINED")})
        killed = counts.get("killed", 0) + counts.get("timeout", 0)
        summary[f] = {"killed": killed, "total": len(codes), "kill_rate": round(killed / max(len(codes), 1), 4),
                      "timeouts": counts.get("timeout", 0), "mutants_in_file": in_file,
                      "sampled": sample is not None, "survivors": survivors}
        lo, hi = wilson(killed, len(codes))
        summary[f]["kill_rate_95ci"] = [round(lo, 4), round(hi, 4)] if sample is not None else None
        rows.append(f"| `{f}` | {in_file} | {len(codes)} | {killed} | {counts.get('timeout', 0)} | {len(survivors)} | "
                    f"{killed / max(len(codes), 1):.1%}" + (f" ({lo:.0%} to {hi:.0%})" if sample is not None else "")
                    + " |")

    mm = MUTMUT
    tests = ", ".join(mm["pytest_add_cli_args_test_selection"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mutation.json").write_text(json.dumps(summary, indent=2) + "\n")
    md += ["# Mutation testing: the optimizer (symo/optim/) and symo/runtime/linalg.py", "",
           "Command: `" + (COMMAND if sample is None else SAMPLED_COMMAND.format(n=len(sample) // len(FILES)))
           + f"` (mutmut 3, configuration in pyproject.toml `[tool.mutmut]`; the tests in {tests}; torch.compile "
           "tests left out). A timeout counts as killed. Survivors are listed with the reason each is equivalent "
           "or harmless (benchmarks/mutation_survivors.json).", "",
           ("Tested: the full set, every mutant mutmut generates for these files; the survivors of the full "
            "run were then re-tested with the tests added for them (`--rerun-survivors`), and the mutants that "
            "timed out on the loaded machine re-run." if sample is None else
            f"Tested: a seeded random sample of {len(sample) // len(FILES)} mutants per file "
            "(random.Random(13)). The rates are over the sample, with a 95% Wilson interval."), "",
           "| file | mutants in file | tested | killed | of which timeouts | not killed | kill rate"
           + (" (95% interval) |" if sample is not None else " |"),
           "|---|---|---|---|---|---|---|", *rows, ""]
    for f, s in summary.items():
        md += [f"## Survivors in `{f}`", ""]
        if not s["survivors"]:
            md += ["(none)", ""]
            continue
        md += ["| mutant | status | change | why it is harmless |", "|---|---|---|---|"]
        for sv in s["survivors"]:
            change = sv["diff"].replace("|", "\\|")
            md.append(f"| `{sv['mutant'].split('.', 2)[-1]}` | {sv['status']} | `{change}` | {sv['reason']} |")
        md.append("")
    (args.out / "mutation.md").write_text("\n".join(md))
    print("\n".join(rows))


def _natural(name: str):
    head, _, num = name.rpartition("_")
    return (head, int(num) if num.isdigit() else 0)


if __name__ == "__main__":
    main()
