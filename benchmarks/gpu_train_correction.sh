#!/usr/bin/env bash
# MDOT on GPUs, trained on a lent GPU: `bench_gpu_logo.py --final` (the correction of the
# spec-sheet price fitted on every measured GPU step we have, each epoch timed) into
# OUT/final-gpu.json, after the kit. The rows are priced by the spec-sheet step model, which
# needs LightGBM, not in the GPU image: carry its wheel in .whl/ (the device README says how).
# NeuSight's 22 rows come along where .neusight/ travels (its label/ and model_configs/
# folders, and in .neusight/onnx the exports `bench_gpu_ops.py --onnx` keeps); without it
# they are left out, and said so.
# Here, before the run (ignored folders; about 5 MB travel):
#   printf '/.whl/\n/.neusight/\n' >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl lightgbm==4.7.0
#   mkdir -p .neusight && (cd ../shared/datasets/neusight && find label model_configs \
#     -name '*-train-*.json' -o -path 'model_configs/*' | tar -cf - -T -) | tar -xf - -C .neusight
#   cp -r ONNX_CACHE .neusight/onnx   # the exports of bench_gpu_ops.py --onnx ONNX_CACHE
# then, on the GPU machine (run's carry: .whl, .neusight):
#   bash benchmarks/gpu_train_correction.sh $OUT
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
mkdir -p "$OUT"
$PY benchmarks/bench_gpu_logo.py .neusight --onnx .neusight/onnx \
  --cache "${CACHE:-/tmp/gpu-steps.pkl}" --final --out "$OUT"
