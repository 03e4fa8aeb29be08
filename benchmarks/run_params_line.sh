#!/usr/bin/env bash
# docs/operators.md, section 13 (rule written before any held-out run): the operator-sum line
# with a parameter term (`op-sum-params`) against `op-sum`, alone and as the third member, on
# fresh folds (fold seed 3), with the shipped kernel model's operator data. Evaluation only:
# any machine; resumable (`mdot evaluate` skips each (method, fold, seed) it has).
#   nohup bash benchmarks/run_params_line.sh > /tmp/params-line.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
OUT=benchmarks/results/$SLUG-fused-v2-ops-family-folds3
FOLD_SEED=3
ENSEMBLES=gnn+lightgbm+op-sum,gnn+lightgbm+op-sum-params
. benchmarks/ops_runs.sh
first_ops
runs lightgbm,op-sum,op-sum-params
python benchmarks/compare_runs.py --dataset "$DATA" --a "$OUT" --b "$OUT" \
  --methods gnn+lightgbm+op-sum,gnn+lightgbm+op-sum-params,op-sum,op-sum-params,lightgbm,gnn
