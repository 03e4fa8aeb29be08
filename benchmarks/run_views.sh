#!/usr/bin/env bash
# The inference-export views of two datasets (same samples and labels, the graph a user gets
# from torch.onnx.export(model.eval(), ...)), then leave-family-out predictions from each view
# by models trained on the training exports (docs/ingestion.md). Resumable:
#   nohup nice -n 10 bash benchmarks/run_views.sh > /tmp/views.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
for ds in cpu-amd-epyc-f25m17-2t-fused timm-rtx3090-fused; do
  for view in torchscript dynamo; do
    mdot dataset resequence "data/derived/$ds" --out "data/derived/$ds-$view" --view "$view"
  done
done
