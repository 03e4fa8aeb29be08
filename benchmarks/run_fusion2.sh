#!/usr/bin/env bash
# Fusion version 2 (docs/operators.md, section 7, rule written before these runs): the shipped
# recipes' leave-family-out evaluations again on the `-fused-v2` copies (data/README.md), with
# the folds, seeds and budget of their version-1 tables. Resumable per (method, fold, seed):
#   nohup bash benchmarks/run_fusion2.sh > /tmp/fusion2.log 2>&1 &
# Order: the fast methods first, then the GNN seed by seed, so a stopped run leaves
# comparable pairs; MDOT (rule 2 of section 4) last. Rule 1 adopted version 2 (2026-11-26):
# the `-fused-v2` copies the first rows were run on are now the `-fused` folders (same
# samples, same sequences fingerprint), so the runs resume on those.
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET='{"epochs": 20, "patience": 5}'
F25=cpu-amd-epyc-f25m17-2t
F26=cpu-amd-epyc-f26m2-2t
ev() {  # NAME METHODS SEEDS [--op-costs OPS], on data/derived/NAME-fused (version 2)
  local name=$1 methods=$2 seeds=$3 out=benchmarks/results/$1-fused-v2-family; shift 3
  if [ "${1:-}" = --op-costs ]; then out=benchmarks/results/$name-fused-v2-ops-family; fi
  mdot evaluate --dataset "data/derived/$name-fused" --split family --folds 5 \
    --seeds "$seeds" --methods "$methods" --train-config "$BUDGET" --out "$out" "$@" > /dev/null
}
OPS=(--op-costs "data/$F25/ops")
ev "$F25" lightgbm,op-sum 2 "${OPS[@]}"
ev timm-rtx3090 lightgbm 2
ev "$F26" lightgbm 1
for seeds in 1 2; do
  ev "$F25" gnn $seeds "${OPS[@]}"
  ev timm-rtx3090 gnn $seeds
done
ev "$F26" gnn 1
ev "$F25" lightgbm,gnn 2  # without operator times: the row the others are read against
ev "$F25" mdot-pe-none 2 "${OPS[@]}"
for name in "$F25" timm-rtx3090 "$F26"; do  # the tables, with the pairs
  mdot evaluate --dataset "data/derived/$name-fused" --summary-only \
    --out "benchmarks/results/$name-fused-v2-family" --ensembles gnn+lightgbm
done
mdot evaluate --dataset "data/derived/$F25-fused" --summary-only \
  --out "benchmarks/results/$F25-fused-v2-ops-family" \
  --ensembles gnn+lightgbm,mdot-pe-none+lightgbm,gnn+lightgbm+op-sum,lightgbm+op-sum
