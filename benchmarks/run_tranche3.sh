#!/usr/bin/env bash
# docs/operators.md, section 11 (rule written before this script ran): 21 architectures of
# families the Zen 4 dataset lacks, measured with the first pass's protocol, the core set once
# more (the day's speed), the fused copy grown, and the confirming runs with the shipped kernel
# model's operator data. Resumable: every step skips what is done. The first two steps are
# measurements: nothing else may run on the machine meanwhile; `mdot profile` refuses the
# folder on a day the machine runs its samples more than 15% off their labels (try another day).
#   nohup bash benchmarks/run_tranche3.sh > /tmp/tranche3.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
. benchmarks/ops_runs.sh
on_device
MODELS=botnet26t_256,sebotnet33ts_256,coatnext_nano_rw_224,vitamin_small_224  # timm, then transformers configs
MODELS+=,deberta-small,mpnet-small,convbert-small,squeezebert-small,phi-small,gptneox-small
MODELS+=,biogpt-small,llama-small,gemma-small,falcon-small,funnel-small,mobilebert-small
MODELS+=,gptneo-small,gptj-small,opt-small,bloom-small,ctrl-small
mdot profile --zoo torchvision,timm,hf --models "$MODELS" --batch-sizes 2,4,8,16,32,64 \
  --image-sizes 64 --seq-lens 32 --threads 2 --max-iter-s 2.5 --budget-s 12
[ -f "data/$SLUG/core-set-passes/6/report.json" ] || \
  mdot profile --core-set --out "data/$SLUG/core-set-passes/6"
DATA=data/derived/$SLUG-fused-tranche3  # the shipped checkpoint's copy stays as it is
[ -d "$DATA" ] || cp -r "data/derived/$SLUG-fused" "$DATA"
mdot dataset resequence "data/$SLUG" --out "$DATA"  # resumes: only the new samples
OUT=benchmarks/results/$SLUG-fused-v2-ops-tranche3-family
first_ops
runs
python benchmarks/compare_runs.py --dataset "$DATA" \
  --a "benchmarks/results/$SLUG-fused-v2-ops-family" --b "$OUT" --on-a \
  --methods gnn+lightgbm+op-sum,gnn+lightgbm,op-sum,lightgbm
