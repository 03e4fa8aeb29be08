# Sourced by the operator studies' scripts (run_ops_more.sh, run_two_pass.sh): the confirming
# runs of docs/operators.md sections 9-11 on the folds of section 7, with operator data $OPS,
# into $OUT, compared run for run with the first operator data's folder. Needs SLUG, OPS, OUT;
# DATA (the model dataset) defaults to the device's fused copy.
DATA=${DATA:-data/derived/$SLUG-fused}
ev() {  # METHODS SEEDS
  mdot evaluate --dataset "$DATA" --split family --folds 5 --seeds "$2" \
    --op-costs "$OPS" --train-config '{"epochs": 20, "patience": 5}' \
    --methods "$1" --out "$OUT" --ensembles gnn+lightgbm+op-sum,gnn+lightgbm > /dev/null
}
confirm() {  # METHODS to compare
  ev lightgbm,op-sum 2
  ev gnn 1
  ev gnn 2
  python benchmarks/compare_runs.py --dataset "$DATA" \
    --a "benchmarks/results/$SLUG-fused-v2-ops-family" --b "$OUT" \
    --methods "$1" --families efficientnet,mobilenet
}
first_ops() {  # the first 20,320 operators (the shipped kernel model's) as derived data: $OPS
  OPS=data/derived/$SLUG-ops-first
  if [ ! -f "$OPS/samples.jsonl" ]; then
    mkdir -p "$OPS"
    git show "c9516c4c~1:data/$SLUG/ops/samples.jsonl" > "$OPS/samples.jsonl.tmp"
    mv "$OPS/samples.jsonl.tmp" "$OPS/samples.jsonl"
  fi
}
