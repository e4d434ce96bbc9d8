#!/usr/bin/env bash
# The main job: train the default small GPT (4 layers, 4 heads, d_model 128, context 64, batch 16, 500 steps)
# on the bundled Shakespeare with Symo (Muon-style spec), with a progress bar; ends with a text sample
# and the path of the loss plot. Any `symo train` option can be appended, e.g. --optimizer adamw.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/symo train "$@"
