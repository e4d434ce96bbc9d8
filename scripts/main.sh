#!/usr/bin/env bash
# The main job: train the default small GPT (4 layers, 4 heads, d_model 128, context 64, batch 16, 500 steps)
# on the bundled Shakespeare with Symo (its default step, SOAP-Muon, on the Muon-style spec with q, k and v as
# three blocks), with a progress bar; ends with a text sample and the path of the loss plot. Any `symo train`
# option can be appended, e.g. --optimizer adamw.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# One torch thread: this model is small enough that a second thread gains little on an idle machine, and
# on shared cores two threads that wait for each other can be many times slower (options after it win).
exec .venv/bin/symo train --threads 1 "$@"
