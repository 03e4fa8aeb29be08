#!/usr/bin/env bash
# docs/operators.md, section 15 (rule written before this was built): embedding tables priced
# by their parameter count, the confirming runs paired with section 11's (and beside
# section 14's). Nothing is measured; resumable (`mdot evaluate` per method, fold and seed).
#   nohup bash benchmarks/run_tables_curve.sh > /tmp/tables-curve.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
. benchmarks/ops_runs.sh
DATA=data/derived/$SLUG-fused-tranche3
[ -f "$DATA/samples.jsonl" ] || { echo "$DATA: run benchmarks/run_tranche3.sh first" >&2; exit 1; }
OUT=benchmarks/results/$SLUG-fused-v2-ops-tables-curve-tranche3-family
tables_ops
OP_TABLES=1
ENSEMBLES=gnn+lightgbm+op-sum-params,gnn+lightgbm+op-sum,gnn+lightgbm
runs lightgbm,op-sum,op-sum-params
for A in "benchmarks/results/$SLUG-fused-v2-ops-tranche3-family" \
         "benchmarks/results/$SLUG-fused-v2-ops-tables-tranche3-family"; do
  compare_tables "$A"
done
