#!/usr/bin/env bash
# MDOT on GPUs, trained on a lent GPU: `bench_gpu_logo.py --final` (the correction of the
# spec-sheet price fitted on every measured GPU step we have, each epoch timed) into
# OUT/final-gpu.json, after the kit. The rows are priced here first (the spec-sheet step model
# needs LightGBM, not in the GPU image, and pricing is CPU work) and travel as an xz pickle
# (about 4 MB) in .gpucache/ (ignored by git):
#   python benchmarks/bench_gpu_ops.py ../shared/datasets/neusight --onnx /tmp/ns-onnx \
#     --out /tmp/ns-out                      # NeuSight's exports, about 4 minutes
#   python benchmarks/bench_gpu_logo.py ../shared/datasets/neusight --onnx /tmp/ns-onnx \
#     --price-only                            # into /tmp/gpu-steps.pkl, about 2 minutes
#   mkdir -p .gpucache && xz -3 -c /tmp/gpu-steps.pkl > .gpucache/gpu-steps.pkl.xz
# then, on the GPU machine (run's carry: .gpucache):
#   bash benchmarks/gpu_train_correction.sh $OUT
# Without the cache it prices the rows there, which needs LightGBM's wheel carried in .whl/
# (`pip download --only-binary=:all: --python-version 3.12 ... lightgbm`) and NeuSight's
# labels and exports in .neusight/ (else they are left out, and said so).
set -euo pipefail
OUT=${1:?usage: gpu_train_correction.sh OUT}
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TQDM_DISABLE=1
CACHE=${CACHE:-/tmp/gpu-steps.pkl}
if [ -f .gpucache/gpu-steps.pkl.xz ] && [ ! -f "$CACHE" ]; then
  $PY -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    .gpucache/gpu-steps.pkl.xz "$CACHE"
fi
mkdir -p "$OUT"
$PY benchmarks/bench_gpu_logo.py .neusight --onnx .neusight/onnx \
  --cache "$CACHE" --final --out "$OUT"
