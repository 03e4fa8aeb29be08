#!/usr/bin/env bash
# After a GPU lease, on this machine: the standing order's steps, in order. The kit's files (the
# folder `run` brought back) go to DEST (default data/<slug>/, laid out as data/gpu-nvidia-h200/:
# amp-bf16/ and fp32/ samples xz-compressed, kernels.jsonl.xz, llm-steps.jsonl, env.json,
# kit.log); their operator sequences are rebuilt from the zoo (data/derived/<name>-*-fused,
# packed); the GPU's steps are priced (benchmarks/results/<name>-measured); then the
# pre-registered studies run (llm-steps, unaligned-gemms, cnn-kernels: each decides by the rule
# its study page wrote). Nothing is overwritten: an existing DEST or output stops it (name
# another DEST for a second lease of the same GPU). The README under DEST is yours to write.
#   bash benchmarks/after_lease.sh KIT_OUT "CATALOG NAME" [DEST]   # e.g. "h100 sxm"
#   DRY=1 bash benchmarks/after_lease.sh ...                      # say the commands, run none
set -euo pipefail
KIT=${1:?usage: after_lease.sh KIT_OUT "CATALOG NAME" [DEST]}
DEVICE=${2:?usage: after_lease.sh KIT_OUT "CATALOG NAME" [DEST]}
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
NEUSIGHT=${NEUSIGHT:-../shared/datasets/neusight}
[ -f "$KIT/env.json" ] || { echo "after_lease: $KIT/env.json: not a kit's folder" >&2; exit 2; }
SLUG=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["slug"])' "$KIT/env.json")
DEST=${3:-data/$SLUG}
NAME=$(basename "$DEST")
run() { printf '+'; printf ' %q' "$@"; echo; [ -n "${DRY:-}" ] || "$@"; }
compress() { echo "+ xz -c $1 > $2"; [ -n "${DRY:-}" ] || xz -c "$1" > "$2"; }
for f in "$DEST" "data/derived/$NAME-amp-bf16-fused" "data/derived/$NAME-fp32-fused" \
         "benchmarks/results/$NAME-measured" "benchmarks/results/llm-steps-$NAME" \
         benchmarks/results/unaligned-gemms benchmarks/results/cnn-kernels; do
  [ -e "$f" ] && { echo "after_lease: $f exists; name another DEST" >&2; exit 2; }
done

# 1. the kit's files, as the loader reads them
run mkdir -p "$DEST/amp-bf16" "$DEST/fp32"
for p in amp-bf16 fp32; do
  [ -f "$KIT/$p-samples.jsonl" ] || { echo "after_lease: no $KIT/$p-samples.jsonl" >&2; exit 2; }
  compress "$KIT/$p-samples.jsonl" "$DEST/$p/samples.jsonl.xz"
  for f in noisy.jsonl report.json; do
    if [ -f "$KIT/$p-$f" ]; then run cp "$KIT/$p-$f" "$DEST/$p/$f"; fi
  done
done
compress "$KIT/kernels.jsonl" "$DEST/kernels.jsonl.xz"
for f in llm-steps.jsonl env.json kit.log; do
  if [ -f "$KIT/$f" ]; then run cp "$KIT/$f" "$DEST/$f"; fi
done

# 2. operator sequences, rebuilt from the zoo; 3. the steps priced from the spec sheet
for p in amp-bf16 fp32; do
  run mdot dataset resequence "$DEST/$p" --out "data/derived/$NAME-$p-fused"
  run mdot dataset pack "data/derived/$NAME-$p-fused"
  run "$PY" benchmarks/bench_gpu_ops.py "$NEUSIGHT" --measured "data/derived/$NAME-$p-fused" \
    --device "$DEVICE" --out "benchmarks/results/$NAME-measured"
done

# 4. the pre-registered studies (docs/studies/): each results.json says what its rule decided
run "$PY" benchmarks/bench_llm_steps.py "$DEST/llm-steps.jsonl" --loss-memory \
  --out "benchmarks/results/llm-steps-$NAME"
run "$PY" benchmarks/bench_unaligned_gemms.py --sweep "$DEST/kernels.jsonl.xz" \
  --steps "$DEST/llm-steps.jsonl" --out benchmarks/results/unaligned-gemms
run "$PY" benchmarks/bench_cnn_kernels.py --sweep "$DEST/kernels.jsonl.xz" \
  --lease "data/derived/$NAME-amp-bf16-fused=$DEVICE" \
  --lease "data/derived/$NAME-fp32-fused=$DEVICE" --out benchmarks/results/cnn-kernels
echo "after_lease: done; write $DEST/README.md, then the studies' part 2 (their pages)"
