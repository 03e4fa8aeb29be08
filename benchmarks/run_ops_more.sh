#!/usr/bin/env bash
# docs/operators.md, section 9 (rule written before this script ran): more depthwise and
# grouped convolutions measured, the kernel cost model's accuracy again, and the confirming
# runs on the folds of section 7. Resumable: every step skips what is done
# (`mdot profile --ops` resumes its plan; `mdot evaluate` per (method, fold, seed)).
# The first two steps are measurements: nothing else may run on the machine meanwhile.
#   nohup bash benchmarks/run_ops_more.sh > /tmp/ops-more.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
. benchmarks/ops_runs.sh
on_device
mdot profile --ops --ops-more 4000 --ops-kinds Conv:depthwise,Conv:grouped
mdot profile --ops  # the noisy rows once more
python benchmarks/bench_kernels.py "data/$SLUG/ops" --models "data/derived/$SLUG-fused" \
  --out "benchmarks/results/kernels-$SLUG-more"
OUT=benchmarks/results/$SLUG-fused-v2-ops-more-family
OPS=data/$SLUG/ops
confirm gnn+lightgbm+op-sum,gnn+lightgbm,op-sum
