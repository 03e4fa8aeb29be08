# Sourced by the operator studies' scripts (run_ops_more.sh, run_two_pass.sh, run_tranche3.sh,
# run_params_line.sh): the confirming runs of docs/operators.md sections 9-13 (the folds of
# section 7 unless FOLD_SEED says otherwise), with operator data $OPS, into $OUT, compared run
# for run with the first operator data's folder. Needs SLUG; OPS and OUT before `ev`; DATA
# (the model dataset) defaults to the device's fused copy; OP_TABLES=1 prices embedding
# tables by their size (section 15).
DATA=${DATA:-data/derived/$SLUG-fused}
on_device() {  # refuse to measure on another machine than $SLUG
  if [ "$(python -c 'from mdot_jax.data.profile import fingerprint, device_slug
print(device_slug(fingerprint(2)))')" != "$SLUG" ]; then
    echo "this machine is not $SLUG: it cannot be measured here" >&2; exit 1
  fi
}
ev() {  # METHODS SEEDS
  mdot evaluate --dataset "$DATA" --split family --folds 5 --fold-seed "${FOLD_SEED:-0}" \
    --seeds "$2" --op-costs "$OPS" ${OP_TABLES:+--op-tables} --train-config '{"epochs": 20, "patience": 5}' \
    --methods "$1" --out "$OUT" \
    --ensembles "${ENSEMBLES:-gnn+lightgbm+op-sum,gnn+lightgbm}" > /dev/null
}
runs() {  # [METHODS besides gnn]: the confirming runs, 2 seeds each (gnn one seed at a time)
  ev "${1:-lightgbm,op-sum}" 2
  ev gnn 1
  ev gnn 2
}
confirm() {  # METHODS to compare
  runs
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
tables_ops() {  # the first 20,320 operators and the table rows of section 14: $OPS
  first_ops
  local tables=data/derived/$SLUG-ops-tables
  python - "data/$SLUG/ops" "$OPS/samples.jsonl" "$tables" <<'PY'
import json, sys
from pathlib import Path

ops, first, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
from mdot_jax.ops.profile import read_plan
from mdot_jax.ops.specs import OpSpec
table_keys = {OpSpec.from_json(d["spec"]).key for d in read_plan(ops)
              if d.get("extension", "").startswith("Gather:table")}
rows = [x for x in (ops / "samples.jsonl").read_text().splitlines()
        if x.strip() and json.loads(x)["key"] in table_keys]
out.mkdir(parents=True, exist_ok=True)
(out / "samples.jsonl.tmp").write_text(first.read_text() + "".join(r + "\n" for r in rows))
(out / "samples.jsonl.tmp").replace(out / "samples.jsonl")
print(f"{out}: the first operators and {len(rows)} table rows")
PY
  OPS=$tables
}
compare_tables() {  # A: results folder read as the reference; $OUT against it, on the four
  # large-vocabulary families and on the rest (the two halves of sections 14 and 15's rule)
  local big=falcon,bloom,ctrl,gemma methods=gnn+lightgbm+op-sum-params,op-sum-params,lightgbm,gnn
  python benchmarks/compare_runs.py --dataset "$DATA" --a "$1" --b "$OUT" --methods "$methods" \
    --families "$big"
  python benchmarks/compare_runs.py --dataset "$DATA" --a "$1" --b "$OUT" --methods "$methods" \
    --without "$big"
}
