"""Summarise a mutmut run (scripts/mutation.sh) into benchmarks/results/mutation.{md,json}.

Per mutated file: how many mutants the tests killed (a timeout counts as killed: the tests noticed), the
total, and every survivor with its diff and the reason it is harmless, read from
benchmarks/mutation_survivors.json ({mutant name: reason}); a survivor without a reason is marked
"UNEXPLAINED".

    python -m benchmarks.mutation_report --workdir /tmp/symo-mutation --out benchmarks/results

Several work folders (one per room, scripts/mutation.sh with SYMO_MUTATION_ONLY) go in one report: each
folder's own pyproject.toml names the files it mutated, and its sample.txt the sample it tested.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

# the files mutmut mutates (pyproject.toml [tool.mutmut] only_mutate): the kinds and the alignment room
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
    ap.add_argument("--workdir", type=Path, nargs="+", default=[Path("/tmp/symo-mutation")],
                    help="mutmut work folders (scripts/mutation.sh's), one per room")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    reasons = json.loads((Path(__file__).parent / "mutation_survivors.json").read_text())
    summary, md = {}, []
    rows = []
    per_file = []  # (file, its work folder, the sample tested there or None)
    for workdir in args.workdir:
        sample_file = workdir / "sample.txt"
        sample = set(sample_file.read_text().split()) if sample_file.exists() else None
        mutated = tomllib.loads((workdir / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
        per_file += [(f, workdir, sample) for f in mutated if (workdir / "mutants" / f"{f}.meta").exists()]
    missing = [f for f in FILES if f not in {f for f, _, _ in per_file}]
    # mutants per file asked of the sampled folders (scripts/mutation.sh --sample N writes N to sample_n.txt)
    sizes = sorted({int((w / "sample_n.txt").read_text()) for w in args.workdir if (w / "sample_n.txt").exists()})
    sample = "/".join(map(str, sizes)) if sizes else None
    for f, workdir, file_sample in sorted(per_file, key=lambda t: FILES.index(t[0]) if t[0] in FILES else 99):
        meta = json.loads((workdir / "mutants" / f"{f}.meta").read_text())
        in_file = len(meta["exit_code_by_key"])
        codes = {k: v for k, v in meta["exit_code_by_key"].items() if file_sample is None or k in file_sample}
        counts: dict[str, int] = {}
        for code in codes.values():
            counts[status(code)] = counts.get(status(code), 0) + 1
        survivors = []
        for name, code in sorted(codes.items(), key=lambda kv: _natural(kv[0])):
            st = status(code)
            if st in ("killed", "timeout"):
                continue
            survivors.append({"mutant": name, "status": st, "diff": diff_of(workdir, name),
                              "reason": reasons.get(name, "UNEXPLAINED")})
        killed = counts.get("killed", 0) + counts.get("timeout", 0)
        summary[f] = {"killed": killed, "total": len(codes), "kill_rate": round(killed / max(len(codes), 1), 4),
                      "timeouts": counts.get("timeout", 0), "mutants_in_file": in_file,
                      "sampled": file_sample is not None, "survivors": survivors}
        lo, hi = wilson(killed, len(codes))
        summary[f]["kill_rate_95ci"] = [round(lo, 4), round(hi, 4)] if file_sample is not None else None
        rows.append(f"| `{f}` | {in_file} | {len(codes)} | {killed} | {counts.get('timeout', 0)} | {len(survivors)} | "
                    f"{killed / max(len(codes), 1):.1%}"
                    + (f" ({lo:.0%} to {hi:.0%})" if file_sample is not None else "") + " |")

    mm = MUTMUT
    tests = ", ".join(mm["pytest_add_cli_args_test_selection"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mutation.json").write_text(json.dumps(summary, indent=2) + "\n")
    md += ["# Mutation testing: the optimizer's kinds (symo/optim/kinds/) and the alignment room (symo/alignment/)",
           "",
           "Command: `" + (COMMAND if sample is None else SAMPLED_COMMAND.format(n=sample))
           + f"` (mutmut 3, configuration in pyproject.toml `[tool.mutmut]`; the tests in {tests}; torch.compile "
           "tests left out). A timeout counts as killed. Survivors are listed with the reason each is equivalent "
           "or harmless (benchmarks/mutation_survivors.json).", "",
           ("Tested: the full set, every mutant mutmut generates for these files; the survivors of the full "
            "run were then re-tested with the tests added for them (`--rerun-survivors`), and the mutants that "
            "timed out on the loaded machine re-run." if sample is None else
            f"Tested: a seeded random sample of {sample} mutants per file (all of a file's mutants where it has "
            "fewer; random.Random(13)). The rates are over the sample, with a 95% Wilson interval."), "",
           "| file | mutants in file | tested | killed | of which timeouts | not killed | kill rate"
           + (" (95% interval) |" if sample is not None else " |"),
           "|---|---|---|---|---|---|---|", *rows, ""]
    if missing:
        md += ["Not measured: " + ", ".join(f"`{f}`" for f in missing) + ".", ""]
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
