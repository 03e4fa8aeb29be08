#!/usr/bin/env bash
# Confirming runs of docs/operators.md, section 8 (the operator sum as a third member): new
# folds (fold seed 2), 2 seeds, with operator times, on the version-2 sequences. Resumable per
# (method, fold, seed); the fast methods first, then the GNN seed by seed:
#   nohup bash benchmarks/run_third_member.sh > /tmp/third-member.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
OUT=benchmarks/results/$SLUG-fused-v2-ops-family-folds2
ev() {  # METHODS SEEDS
  mdot evaluate --dataset "data/derived/$SLUG-fused" --split family --folds 5 --seeds "$2" \
    --fold-seed 2 --op-costs "data/$SLUG/ops" --train-config '{"epochs": 20, "patience": 5}' \
    --methods "$1" --out "$OUT" --ensembles gnn+lightgbm,gnn+lightgbm+op-sum,lightgbm+op-sum \
    > /dev/null
}
ev lightgbm,op-sum 2
ev gnn 1
ev gnn 2
python benchmarks/family_errors.py --dataset "data/derived/$SLUG-fused" --results "$OUT" \
  --methods gnn+lightgbm,gnn+lightgbm+op-sum,lightgbm+op-sum,op-sum
