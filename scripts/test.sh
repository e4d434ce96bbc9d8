#!/usr/bin/env bash
# The test suite: lint, then pytest. Installs what it needs first (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m ruff check compiler symo specs tests benchmarks
# a private kernel cache per run, so tests never depend on (or litter) the user's cache
export SYMO_CACHE_DIR="${SYMO_CACHE_DIR:-$(mktemp -d)}"
# --durations=15: every run (every CI log) ends with the 15 slowest tests, so a test that grows slow is seen
exec .venv/bin/python -m pytest --durations=15 "$@"
