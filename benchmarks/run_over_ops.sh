#!/usr/bin/env bash
# Confirming runs of docs/operators.md, section 6 (learning over the operator sum): new folds
# (fold seed 1), 2 seeds, with operator times. Resumable per (method, fold, seed):
#   nohup bash benchmarks/run_over_ops.sh > /tmp/over-ops.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
OUT=benchmarks/results/$SLUG-fused-ops-family-folds1
mdot evaluate --dataset "data/derived/$SLUG-fused" --split family --folds 5 --seeds 2 \
  --fold-seed 1 --op-costs "data/$SLUG/ops" --train-config '{"epochs": 20, "patience": 5}' \
  --methods lightgbm,lightgbm-over-ops,op-sum,gnn,gnn-over-ops --out "$OUT" \
  --ensembles gnn+lightgbm,gnn-over-ops+lightgbm-over-ops
