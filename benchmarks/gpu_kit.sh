#!/usr/bin/env bash
# The GPU kit: what one short lease of a GPU machine (no network, its own PyTorch) measures,
# in at most KIT_SECONDS (default 510) of wall time, into at most 8 files directly under OUT:
#   env.json                     the GPU's fingerprint (name, SMs, memory, L2, CUDA, cuDNN,
#                                driver, clocks), PyTorch, Python, and what is installed
#   kernels.jsonl                the precision sweep, first: GEMMs, batched GEMMs, fused
#                                attention, elementwise and row-wise kernels on generated shapes
#                                at fp32, tf32, fp16, bf16 and fp8; dense and depthwise
#                                convolutions and batch norm (NCHW and channels-last),
#                                cross-entropy over a vocabulary, AdamW,
#                                language-model heads at unaligned vocabularies and attention's
#                                batched GEMMs at unaligned token counts beside aligned twins,
#                                an LSTM's training pass, SDPA given a learned bias, binary
#                                kernels with a broadcast operand (a mask, a rotary table)
#                                (`mdot_jax.measure.kernel_sweep`)
#   amp-bf16-samples.jsonl       the probe; the GPU set (GPU_MODELS at 224 px or 256 tokens,
#                                batch 32 and 128: steps that occupy the GPU; each traced:
#                                kernels, GPU busy time, the busiest kernels); then the device
#                                core set (64 px, 32 tokens: launch-bound on a big GPU);
#                                autocast to bf16; on a GPU each sample's peak memory too
#   amp-bf16-noisy.jsonl         samples measured, but too noisy to train on (what was skipped
#                                and why: kit.log)
#   amp-bf16-nhwc-samples.jsonl  the GPU set's CNNs (CNN_MODELS, batch 128) in channels-last,
#                                autocast to bf16, traced (docs/studies/channels-last.md)
#   fp32-samples.jsonl           the GPU set at fp32, then as much of the core set as time allows
#   llm-steps.jsonl              a GEMM-bound 1.3B GPT-2 step (2,048 tokens x 4), two
#                                mixtures of experts (Mixtral 8 x top 2, Qwen3-MoE 64 x top 8),
#                                the 1.3B and the 124M fine-tuned with LoRA (rank 16), the
#                                124M with Muon, a Qwen2.5-VL-shaped step (one 448 px image a
#                                sample), then GPT-2 124M / 350M steps at 1,024-4,096 tokens,
#                                bf16 autocast, flash and eager attention, with and without
#                                activation checkpointing (`mdot_jax.measure.llm_steps`);
#                                after the fp32 GPU set, the 124M and the 1.3B compiled
#                                (torch.compile), beside their eager twins
#   kit.log                      every step's output
# Each step is bounded by what time is left and appends as it measures, so a step cut off
# keeps what it measured; run again on the same machine, it resumes (KIT_WORK keeps the
# working folders). Operator sequences are not brought back: `mdot dataset resequence`
# rebuilds them from the zoo here.
#   bash benchmarks/gpu_kit.sh OUT            # on the GPU machine
#   bash benchmarks/gpu_kit.sh --dry-run OUT  # a tiny version on a CPU (under 3 minutes)
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT=${1:?usage: gpu_kit.sh [--dry-run] OUT}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${KIT_WORK:-/tmp/mdot-kit}
BUDGET=${KIT_SECONDS:-510}
PY=${PYTHON:-python3}
START=$(date +%s)
LOG="$OUT/kit.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MDOT_DATA="$WORK" TQDM_DISABLE=1
# `mdot` from this tree, as a program (`timeout` runs programs, not shell functions)
mkdir -p "$WORK/bin"
printf '#!/usr/bin/env bash\nexec %q -c %q "$@"\n' "$PY" \
  'import sys; from mdot_jax.cli import main; sys.exit(main(sys.argv[1:]))' > "$WORK/bin/mdot"
chmod +x "$WORK/bin/mdot"
export PATH="$WORK/bin:$PATH"

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# a step: at most $1 seconds, or what is left less $2 kept for the steps after it
step() {
  local most=$1 keep=$2; shift 2
  local t=$(( $(left) - keep ))
  [ "$t" -gt "$most" ] && t=$most
  if [ "$t" -lt 5 ]; then echo "== skipped (no time left): $*" >> "$LOG"; return; fi
  echo "== $(date +%T) ${t}s: $*" >> "$LOG"
  # progress bars (tqdm frames, split at carriage returns) stay out of the log
  timeout -s INT -k 10 "$t" "$@" 2>&1 | tr '\r' '\n' \
    | grep -av -E '[0-9]+%\||[0-9?]+(sample|it|seq)/s' >> "$LOG"
  echo "== exit ${PIPESTATUS[0]}" >> "$LOG"
}
collect() {  # what comes back: at most 8 files, directly under OUT
  for p in amp-bf16 amp-bf16-nhwc fp32; do
    for f in samples.jsonl noisy.jsonl; do
      [ -f "$WORK/$p/$f" ] && cp "$WORK/$p/$f" "$OUT/$p-$f"
    done
  done
  rm -f "$OUT/amp-bf16-nhwc-noisy.jsonl" "$OUT/fp32-noisy.jsonl"  # the eight
  for f in kernels.jsonl llm-steps.jsonl; do
    [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$f"
  done
  true
}
trap collect EXIT

step 60 0 "$PY" - "$OUT/env.json" <<'EOF'
import importlib.metadata as md, json, sys
from mdot_jax.measure.device import device_slug, fingerprint
fp = fingerprint(1, precision="amp-bf16")
names = ("torch", "torchvision", "timm", "transformers", "huggingface-hub", "onnx", "onnxscript",
         "jax", "flax", "optax", "orbax-checkpoint", "lightgbm", "numpy", "scipy", "tqdm")
have = {}
for n in names:
    try:
        have[n] = md.version(n)
    except md.PackageNotFoundError:
        have[n] = None
json.dump(dict(fingerprint=fp, slug=device_slug(fp), packages=have), open(sys.argv[1], "w"),
          indent=1)
EOF

if [ "$DRY" = 1 ]; then
  KEYS=resnet18/i32/b2,mobilenet_v3_small/i32/b2
  step 20 140 "$PY" -m mdot_jax.measure.kernel_sweep "$WORK/kernels.jsonl" --dry-run --seconds 10
  step 60 60 mdot probe --precision amp-bf16 --threads 2 --out "$WORK/amp-bf16" --keys "$KEYS"
  step 30 50 mdot profile --precision amp-bf16 --layout nhwc --zoo torchvision \
    --models resnet18 --batch-sizes 2 --image-sizes 32 --threads 2 --out "$WORK/amp-bf16-nhwc"
  step 40 25 mdot profile --precision fp32 --zoo torchvision --models resnet18 \
    --batch-sizes 2 --image-sizes 32 --threads 2 --trace --out "$WORK/fp32"
  step 30 20 "$PY" -m mdot_jax.measure.llm_steps "$WORK/llm-steps.jsonl" --dry-run --seconds 15
  step 60 0 "$PY" -m mdot_jax.measure.llm_steps "$WORK/llm-steps.jsonl" --dry-run \
    --keys-with /compiled --seconds 10  # what is left: compiling takes 20-40 s on 2 cores
else
  # the GPU set: every name is a zoo model (tests/test_gpu_kit.py checks)
  GPU_MODELS=resnet50,resnet101,convnext_tiny,efficientnet_b0,densenet121,mobilenet_v3_large
  GPU_MODELS+=,vit_b_16,swin_t,regnet_y_8gf,efficientnet_b3,bert-base,gpt2-small
  GPU_MODELS+=,distilbert-base,llama-small
  CNN_MODELS=resnet50,convnext_tiny,efficientnet_b0,mobilenet_v3_large,regnet_y_8gf,densenet121
  # each sample traced: one more step under the profiler (its kernels, the GPU's busy time)
  GPU_SET=(--zoo torchvision,timm,hf --models "$GPU_MODELS" --image-sizes 224 --seq-lens 256
           --batch-sizes 32,128 --threads 8 --trace)
  step 120 390 "$PY" -m mdot_jax.measure.kernel_sweep "$WORK/kernels.jsonl" --seconds 110
  step 45 345 mdot probe --precision amp-bf16 --threads 8 --out "$WORK/amp-bf16"
  step 150 215 mdot profile "${GPU_SET[@]}" --precision amp-bf16 --out "$WORK/amp-bf16"
  step 80 135 "$PY" -m mdot_jax.measure.llm_steps "$WORK/llm-steps.jsonl" --seconds 70
  # the same graphs at fp32: their sequences are made already (no second export)
  mkdir -p "$WORK/fp32/seqs" && cp -n "$WORK"/amp-bf16/seqs/*.npz "$WORK/fp32/seqs/" 2>/dev/null
  step 110 45 mdot profile "${GPU_SET[@]}" --precision fp32 --out "$WORK/fp32"
  # compiled steps (torch.compile: the first step compiles, up to a minute)
  step 120 45 "$PY" -m mdot_jax.measure.llm_steps "$WORK/llm-steps.jsonl" \
    --keys-with /compiled --seconds 45
  # the CNNs in channels-last (their sequences are the NCHW ones: no second export)
  mkdir -p "$WORK/amp-bf16-nhwc/seqs" && cp -n "$WORK"/amp-bf16/seqs/*.npz \
    "$WORK/amp-bf16-nhwc/seqs/" 2>/dev/null
  step 50 70 mdot profile --zoo torchvision,timm --models "$CNN_MODELS" --image-sizes 224 \
    --batch-sizes 128 --threads 8 --trace --precision amp-bf16 --layout nhwc \
    --out "$WORK/amp-bf16-nhwc"
  # the core sets take what is left of the budget
  step 400 60 mdot profile --core-set --precision amp-bf16 --threads 8 --out "$WORK/amp-bf16"
  step 400 0 mdot profile --core-set --precision fp32 --threads 8 --out "$WORK/fp32"
fi
echo "== done in $(( $(date +%s) - START ))s" >> "$LOG"
