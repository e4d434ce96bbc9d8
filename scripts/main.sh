#!/usr/bin/env bash
# The main job: compile the bundled GPT spec for a small GPT and print its structure.
# (Becomes "train a small GPT with Symo" when the nanoGPT training issue lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/symo compile specs/gpt.toml --model symo.models:gpt_small --optimizer "$@"
