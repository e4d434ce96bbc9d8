#!/usr/bin/env bash
# Mutation testing of the optimizer's kinds (symo/optim/kinds/) and the alignment room (symo/alignment/) with
# mutmut 3 (configured in pyproject.toml, [tool.mutmut]). Not part of CI: hours on 2 cores for every mutant, so
# --sample is the usual mode.
#
#   bash scripts/mutation.sh                     # test every mutant not yet judged (resumable)
#   bash scripts/mutation.sh --rerun-survivors   # re-test only the survivors (after adding tests)
#   bash scripts/mutation.sh --sample N          # a seeded random sample of N mutants per file (fits a
#                                                # loaded machine; the report then covers the sample only)
#   bash scripts/mutation.sh --report            # only rewrite benchmarks/results/mutation.{md,json}
#
# It works in a scratch copy ($SYMO_MUTATION_DIR, default /tmp/symo-mutation), so the worktree stays
# clean and can be edited while a run goes on; each run first refreshes the copy from the worktree
# (mutmut re-mutates changed source files and collects coverage for new tests). Workers:
# $SYMO_MUTATION_JOBS (default 2), one thread each. $SYMO_MUTATION_ONLY (a path prefix, e.g. symo/alignment/)
# keeps only the files of only_mutate under it, so two rooms can run in two work folders; the report reads
# every folder named in $SYMO_MUTATION_REPORT_DIRS (default: this run's). Needs `pip install -e '.[mutation]'`.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WORK=${SYMO_MUTATION_DIR:-/tmp/symo-mutation}
JOBS=${SYMO_MUTATION_JOBS:-2}
PY=${PYTHON:-$REPO/.venv/bin/python}
MODE=${1:-run}
if [[ "$MODE" != "--report" ]] && ! "$PY" -c "import mutmut" 2>/dev/null; then
    echo "error: mutmut is not installed in $PY's environment; install it with: pip install -e '.[mutation]'" >&2
    exit 2
fi

mkdir -p "$WORK"
tar --exclude=./.venv --exclude=./mutants --exclude=./.git --exclude='*.egg-info' --exclude='__pycache__' \
    -cf - . | tar -xf - -C "$WORK"
cd "$WORK"
if [[ -n "${SYMO_MUTATION_ONLY:-}" ]]; then
  "$PY" - "$SYMO_MUTATION_ONLY" <<'PYEOF'
import re, sys, tomllib
text = open("pyproject.toml").read()
files = [f for f in tomllib.loads(text)["tool"]["mutmut"]["only_mutate"] if f.startswith(sys.argv[1])]
if not files:
    sys.exit(f"SYMO_MUTATION_ONLY={sys.argv[1]!r} matches none of pyproject.toml's only_mutate")
text = re.sub(r"only_mutate = \[[^\]]*\]", "only_mutate = " + repr(files).replace("'", '"'), text)
open("pyproject.toml", "w").write(text)
PYEOF
fi
export SYMO_CACHE_DIR="$WORK/kernel-cache" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$SYMO_CACHE_DIR" && chmod 700 "$SYMO_CACHE_DIR"

case "$MODE" in
  run)
    rm -f sample.txt sample_n.txt
    "$PY" -m mutmut run --max-children "$JOBS" ;;
  --sample)
    # mutmut lists the mutants in mutants/<file>.meta once it has generated them
    first=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["tool"]["mutmut"]["only_mutate"][0])')
    # `mutmut run` with a name that matches no mutant generates the mutants and collects which tests reach
    # which function, and tests nothing
    if [[ ! -f "mutants/$first.meta" ]]; then "$PY" -m mutmut run --max-children "$JOBS" "no-such-mutant" >/dev/null || true; fi
    echo "${2:?--sample needs a count}" > sample_n.txt
    "$PY" - "$2" > sample.txt <<'PYEOF'
import json, random, sys, tomllib
n = int(sys.argv[1])
for f in tomllib.load(open("pyproject.toml", "rb"))["tool"]["mutmut"]["only_mutate"]:
    names = sorted(json.load(open(f"mutants/{f}.meta"))["exit_code_by_key"])
    print("\n".join(sorted(random.Random(13).sample(names, min(n, len(names))))))
PYEOF
    # judged mutants keep their verdict (mutmut re-tests every mutant named on its command line)
    "$PY" - > sample_todo.txt <<'PYEOF'
import json, tomllib
sample = set(open("sample.txt").read().split())
for f in tomllib.load(open("pyproject.toml", "rb"))["tool"]["mutmut"]["only_mutate"]:
    for name, code in json.load(open(f"mutants/{f}.meta"))["exit_code_by_key"].items():
        if name in sample and code not in (0, 1, 3):
            print(name)
PYEOF
    echo "a sample of $(wc -l < sample.txt) mutants, $(wc -l < sample_todo.txt) not yet judged"
    if [[ -s sample_todo.txt ]]; then xargs -a sample_todo.txt "$PY" -m mutmut run --max-children "$JOBS"; fi ;;
  --rerun-survivors)
    # mutmut forgets every verdict when the tests changed (it re-collects which tests reach what, already
    # when listing results), so the verdicts are saved first and those of the mutants not re-tested kept:
    # adding tests cannot revive a killed mutant
    find mutants/symo -name '*.meta' -exec cp {} {}.before \;
    mapfile -t survivors < <("$PY" -m mutmut results | awk -F': ' '$2 == "survived" {gsub(/ /, "", $1); print $1}' |
                             { if [[ -f sample.txt ]]; then grep -Fxf sample.txt; else cat; fi })
    echo "re-testing ${#survivors[@]} survivors"
    if (( ${#survivors[@]} )); then "$PY" -m mutmut run --max-children "$JOBS" "${survivors[@]}"; fi
    "$PY" - <<'PYEOF'
import glob, json
for before in glob.glob("mutants/symo/**/*.meta.before", recursive=True):
    now_path = before[:-len(".before")]
    old, now = json.load(open(before)), json.load(open(now_path))
    codes = now["exit_code_by_key"]
    kept = 0
    for name, code in old["exit_code_by_key"].items():
        if codes.get(name) is None and code is not None:
            codes[name], kept = code, kept + 1
    json.dump(now, open(now_path, "w"))
    print(f"{now_path}: kept {kept} earlier verdicts")
PYEOF
    ;;
  --report) ;;
  *) echo "usage: $0 [--sample N | --rerun-survivors | --report]" >&2; exit 2 ;;
esac
read -ra DIRS <<< "${SYMO_MUTATION_REPORT_DIRS:-$WORK}"
(cd "$REPO" && "$PY" -m benchmarks.mutation_report --workdir "${DIRS[@]}" --out "$REPO/benchmarks/results")
