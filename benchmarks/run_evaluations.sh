#!/usr/bin/env bash
# The committed accuracy tables: every method on identical leave-family-out folds.
# Resumable per (method, fold, seed): re-run after a stop and it continues.
#   nohup bash benchmarks/run_evaluations.sh [DATASET_DIR ...] > /tmp/evaluate.log 2>&1 &
# Default: the local CPU dataset, then timm-rtx3090. The neural methods (MDOT, its ablations,
# LSTM, GNN, per-operator) share one budget.
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET='{"epochs": 20, "patience": 5}'
DATASETS=("$@")
[ ${#DATASETS[@]} -gt 0 ] || DATASETS=(data/cpu-amd-epyc-2t "$HOME/.cache/mdot/datasets/timm-rtx3090")
for ds in "${DATASETS[@]}"; do
  mdot evaluate --dataset "$ds" --split family --folds 5 --methods all \
    --train-config "$BUDGET" --out "benchmarks/results/$(basename "$ds")-family"
done
