#!/usr/bin/env bash
# docs/operators.md, section 14 (rule written before this script ran): the embedding tables
# the operator data lacks, measured; the kernel model's accuracy on them; the confirming runs
# paired with section 11's. Resumable: every step skips what is done. The first two steps are
# measurements: nothing else may run on the machine meanwhile.
#   nohup bash benchmarks/run_tables.sh > /tmp/tables.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
. benchmarks/ops_runs.sh
on_device
FROM=data/derived/cpu-amd-epyc-2t-fused,data/derived/cpu-amd-epyc-f26m2-2t-fused
FROM+=,data/derived/$SLUG-fused,data/derived/$SLUG-fused-tranche3
mdot profile --ops --ops-more 205 --ops-kinds Gather:table --ops-from "$FROM"
mdot profile --ops  # the noisy rows once more
python benchmarks/bench_kernels.py "data/$SLUG/ops" --models "data/derived/$SLUG-fused" \
  --out "benchmarks/results/kernels-$SLUG-tables"
DATA=data/derived/$SLUG-fused-tranche3
OUT=benchmarks/results/$SLUG-fused-v2-ops-tables-tranche3-family
tables_ops
ENSEMBLES=gnn+lightgbm+op-sum-params,gnn+lightgbm+op-sum,gnn+lightgbm
runs lightgbm,op-sum,op-sum-params
compare_tables "benchmarks/results/$SLUG-fused-v2-ops-tranche3-family"
