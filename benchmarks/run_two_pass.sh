#!/usr/bin/env bash
# docs/operators.md, section 10 (rule written before the second pass was measured): labels the
# smaller of two passes, the kernel cost model's accuracy on them, and the confirming runs on
# the folds of section 7. Needs `mdot profile --ops --ops-again` finished on the device (a
# measurement: alone on that machine); the rest is evaluation and runs on any machine.
# Resumable: `mdot evaluate` skips each (method, fold, seed) it has.
#   nohup bash benchmarks/run_two_pass.sh > /tmp/two-pass.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
OPS=data/derived/$SLUG-ops-2pass
[ -f "$OPS/samples.jsonl" ] || python benchmarks/two_pass_ops.py "data/$SLUG/ops" --first-plan \
  --out "$OPS"
[ -f "benchmarks/results/kernels-$SLUG-2pass/results.json" ] || \
  python benchmarks/bench_kernels.py "$OPS" --models "data/derived/$SLUG-fused" \
    --out "benchmarks/results/kernels-$SLUG-2pass"
OUT=benchmarks/results/$SLUG-fused-v2-ops-2pass-family
. benchmarks/ops_runs.sh
confirm gnn+lightgbm+op-sum,gnn+lightgbm,op-sum,lightgbm
