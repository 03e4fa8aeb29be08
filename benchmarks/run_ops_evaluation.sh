#!/usr/bin/env bash
# Leave-family-out with and without operator times on one device (docs/operators.md, rule in
# section 4): the same folds, seeds and budget. Resumable per (method, fold, seed).
#   nohup bash benchmarks/run_ops_evaluation.sh > /tmp/ops-eval.log 2>&1 &
# Order: the fast methods, then the GNN and then MDOT, seed by seed, so a stopped run leaves
# comparable pairs.
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
DS=data/derived/$SLUG-fused
OPS=data/$SLUG/ops
BASE=benchmarks/results/$SLUG-fused-family
WITH=benchmarks/results/$SLUG-fused-ops-family
BUDGET='{"epochs": 20, "patience": 5}'
ev() {  # OUT METHODS SEEDS [--op-costs OPS]
  local out=$1 methods=$2 seeds=$3; shift 3
  mdot evaluate --dataset "$DS" --split family --folds 5 --seeds "$seeds" --methods "$methods" \
    --train-config "$BUDGET" --out "$out" "$@" > /dev/null
}
ev "$BASE" lightgbm 2
ev "$WITH" lightgbm,op-sum 2 --op-costs "$OPS"
for m in gnn mdot-pe-none; do
  for seeds in 1 2; do
    ev "$BASE" $m $seeds
    ev "$WITH" $m $seeds --op-costs "$OPS"
  done
done
for out in "$BASE" "$WITH"; do  # the tables, with the pairs
  mdot evaluate --dataset "$DS" --out "$out" --summary-only \
    --ensembles gnn+lightgbm,mdot-pe-none+lightgbm$( [ "$out" = "$WITH" ] && echo ,op-sum+lightgbm)
done
