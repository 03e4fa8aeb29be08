#!/usr/bin/env bash
# After a GPU lease, on this machine: the standing order's steps, in order. The kit's files (the
# folder `run` brought back) go to DEST (default data/<slug>/, laid out as data/gpu-nvidia-h200/:
# amp-bf16/, amp-bf16-nhwc/ and fp32/ samples xz-compressed, kernels.jsonl.xz, llm-steps.jsonl,
# env.json, kit.log); their operator sequences are rebuilt from the zoo
# (data/derived/<name>-*-fused, packed); the GPU's steps are priced
# (benchmarks/results/<name>-measured); then the pre-registered studies run (llm-steps,
# unaligned-gemms, cnn-kernels, whole-layers, broadcast-operands: each decides by the rule its
# study page wrote; channels-last: reported). Nothing is overwritten: an existing DEST or
# output stops it (name another DEST for a second lease of the same GPU). A precision without samples, or a study
# without its measurements, is said and left out; a study that fails does not stop the others.
# The README under DEST is yours to write.
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
failed=()
study() {  # a pre-registered study: one that fails is said at the end; the others still run
  run "$@" || failed+=("$2")
}
compress() { echo "+ xz -c $1 > $2"; [ -n "${DRY:-}" ] || xz -c "$1" > "$2"; }
# the precisions the kit brought samples of (a step cut off, or all its samples noisy: none)
PRECS=()
for p in amp-bf16 amp-bf16-nhwc fp32; do
  if [ -f "$KIT/$p-samples.jsonl" ]; then PRECS+=("$p"); else echo "after_lease: no $p samples"; fi
done
# a kit whose GPU set failed can still have brought its sweep and its LLM steps
if [ "${#PRECS[@]}" = 0 ] && [ ! -f "$KIT/kernels.jsonl" ] && [ ! -f "$KIT/llm-steps.jsonl" ]; then
  echo "after_lease: $KIT: no samples, no kernel sweep, no LLM steps" >&2; exit 2
fi
for f in "$DEST" "data/derived/$NAME-amp-bf16-fused" "data/derived/$NAME-fp32-fused" \
         "benchmarks/results/$NAME-measured" "benchmarks/results/llm-steps-$NAME" \
         "benchmarks/results/unaligned-gemms-$NAME" "benchmarks/results/cnn-kernels-$NAME" \
         "benchmarks/results/layers-$NAME" "data/derived/$NAME-amp-bf16-nhwc-fused" \
         "benchmarks/results/channels-last-$NAME"; do
  [ -e "$f" ] && { echo "after_lease: $f exists; name another DEST" >&2; exit 2; }
done

# 1. the kit's files, as the loader reads them
run mkdir -p "$DEST"
for p in "${PRECS[@]}"; do
  run mkdir -p "$DEST/$p"
  compress "$KIT/$p-samples.jsonl" "$DEST/$p/samples.jsonl.xz"
  for f in noisy.jsonl report.json; do
    if [ -f "$KIT/$p-$f" ]; then run cp "$KIT/$p-$f" "$DEST/$p/$f"; fi
  done
done
if [ -f "$KIT/kernels.jsonl" ]; then compress "$KIT/kernels.jsonl" "$DEST/kernels.jsonl.xz"; fi
for f in llm-steps.jsonl env.json kit.log; do
  if [ -f "$KIT/$f" ]; then run cp "$KIT/$f" "$DEST/$f"; fi
done

# 2. operator sequences, rebuilt from the zoo; 3. the steps priced from the spec sheet
LEASES=()
for p in "${PRECS[@]}"; do
  [ "$p" = amp-bf16-nhwc ] || LEASES+=(--lease "data/derived/$NAME-$p-fused=$DEVICE")
  run mdot dataset resequence "$DEST/$p" --out "data/derived/$NAME-$p-fused"
  run mdot dataset pack "data/derived/$NAME-$p-fused"
  run "$PY" benchmarks/bench_gpu_ops.py "$NEUSIGHT" --measured "data/derived/$NAME-$p-fused" \
    --device "$DEVICE" --out "benchmarks/results/$NAME-measured"
done

# 4. the pre-registered studies (docs/studies/): each results.json says what its rule decided;
# a study whose measurements did not come back is said, not run
brought() {  # the kit brought $1, or say which studies wait for it
  [ -f "$KIT/$1" ] || { echo "after_lease: no $1: $2 wait"; return 1; }
}
steps=0 sweep=0
brought llm-steps.jsonl "the llm-steps and unaligned-gemms studies" && steps=1
brought kernels.jsonl "the unaligned-gemms, cnn-kernels, whole-layers, deformable-sampling and broadcast-operands studies" && sweep=1
if [ $steps = 1 ]; then
  study "$PY" benchmarks/bench_llm_steps.py "$DEST/llm-steps.jsonl" --experts-fp32 \
    --out "benchmarks/results/llm-steps-$NAME"
fi
if [ $steps$sweep = 11 ]; then
  study "$PY" benchmarks/bench_unaligned_gemms.py --sweep "$DEST/kernels.jsonl.xz" \
    --steps "$DEST/llm-steps.jsonl" --out "benchmarks/results/unaligned-gemms-$NAME"
fi
if [ $sweep = 1 ]; then
  if [ "${#LEASES[@]}" -gt 0 ]; then
    study "$PY" benchmarks/bench_cnn_kernels.py --sweep "$DEST/kernels.jsonl.xz" \
      "${LEASES[@]}" --out "benchmarks/results/cnn-kernels-$NAME"
  else
    echo "after_lease: no samples: the cnn-kernels study waits (it scores the lease's own steps)"
  fi
  study "$PY" benchmarks/bench_layers.py "$DEST/kernels.jsonl.xz" \
    --out "benchmarks/results/layers-$NAME"
  study "$PY" benchmarks/bench_broadcast.py --sweep "$DEST/kernels.jsonl.xz" \
    --out "benchmarks/results/broadcast-$NAME"
  if [ -f "$KIT/amp-bf16-nhwc-samples.jsonl" ]; then  # the lease's own channels-last steps
    study "$PY" benchmarks/bench_channels_last.py --sweep "$DEST/kernels.jsonl.xz" \
      --dataset "data/derived/$NAME-amp-bf16-nhwc-fused" --device "$DEVICE" \
      --out "benchmarks/results/channels-last-$NAME"
  fi
fi
if [ "${#failed[@]}" -gt 0 ]; then
  echo "after_lease: failed: ${failed[*]} (its output above); the rest is done" >&2
  exit 1
fi
echo "after_lease: done; write $DEST/README.md, then the studies' part 2 (their pages)"
