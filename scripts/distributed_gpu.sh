#!/usr/bin/env bash
# Symo's distributed modes on a GPU machine (NCCL, one GPU per process), as the CPU tests check them on
# gloo: the distributed benchmark (traffic, collectives, matrix functions per rank, step time), then
# `symo train` under torchrun with DDP and with FSDP2 (the default SOAP-Muon, and stored statistics).
#   bash scripts/distributed_gpu.sh            # every visible GPU (at least 2)
#   NPROC=4 bash scripts/distributed_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
N=${NPROC:-$(nvidia-smi -L | wc -l)}
if [ "$N" -lt 2 ]; then
  echo "needs at least 2 GPUs (found $N); set NPROC to use fewer of more" >&2
  exit 2
fi
OUT=${OUT:-runs/distributed-gpu}
mkdir -p "$OUT"

# 1. the benchmark on NCCL, worlds 1, 2 and N
WORLDS=1,2
if [ "$N" -gt 2 ]; then WORLDS="$WORLDS,$N"; fi
"$PY" -m benchmarks.distributed --device cuda --backend nccl --worlds "$WORLDS" --out "$OUT/distributed"

# 2. symo train under torchrun: DDP, then FSDP2; the defaults (SOAP-Muon on gpt_muon_qkv), then the
#    published preset on gpt_true (stored block statistics, gathered into each checkpoint)
COMMON=(--device cuda --steps 100 --eval-interval 50 --no-progress --sample-chars 0)
for kind in ddp fsdp; do
  flags=()
  if [ "$kind" = fsdp ]; then flags=(--fsdp); fi
  "$PY" -m torch.distributed.run --nproc_per_node "$N" -m symo train "${COMMON[@]}" "${flags[@]}" \
      --out-dir "$OUT/train-$kind"
  "$PY" -m torch.distributed.run --nproc_per_node "$N" -m symo train "${COMMON[@]}" "${flags[@]}" --preset published \
      --spec gpt_true --out-dir "$OUT/published-$kind"
done
echo "results in $OUT"
