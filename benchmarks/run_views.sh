#!/usr/bin/env bash
# The inference-export views of two datasets (same samples and labels, the graph a user gets
# from torch.onnx.export(model.eval(), ...)), then leave-family-out predictions from each view
# by models trained on the training exports (docs/ingestion.md, section 6). Resumable (each
# copy per sample, each evaluation per method, fold and seed):
#   nohup bash benchmarks/run_views.sh > /tmp/views.log 2>&1 &
# Each dataset is evaluated as soon as its views exist. A copy is stopped (SIGINT, as Ctrl-C)
# and restarted every 20 minutes (it resumes where it stopped): building hundreds of timm
# models in one process grows it past 10 GB; and after being killed (the OOM killer ends exports of the largest models,
# e.g. EfficientNet-L2 at 475 px: 22 GB), up to 20 times: a graph it died in twice is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
for ds in cpu-amd-epyc-f25m17-2t-fused timm-rtx3090-fused; do
  for view in torchscript dynamo; do
    code=124
    restarts=0
    while [ "$code" -eq 124 ] || { [ "$code" -eq 137 ] && [ "$restarts" -lt 20 ]; }; do
      [ "$code" -eq 137 ] && restarts=$((restarts + 1))
      code=0
      timeout -s INT -k 300 1200 mdot dataset resequence "data/derived/$ds" --out "data/derived/$ds-$view" \
        --view "$view" || code=$?
    done
    [ "$code" -eq 0 ] || exit "$code"
  done
  mdot evaluate --dataset "data/derived/$ds" --split family --folds 5 --seeds 2 \
    --methods lightgbm,gnn --train-config '{"epochs": 20, "patience": 5}' \
    --views "torchscript=data/derived/$ds-torchscript,dynamo=data/derived/$ds-dynamo" \
    --out "benchmarks/results/$ds-views-family" --ensembles gnn+lightgbm
done
