#!/usr/bin/env bash
# Before a lease: the GPU kit on the versions the lease image had (PyTorch, torchvision,
# transformers, timm, huggingface-hub: the `packages` of the newest committed data/*/env.json,
# or ENV), installed beside this machine's in a virtual environment (VENV, kept for the next
# run), so that an API that moved between versions fails here and not in the lease's minutes:
# the kit's dry run, then the exports and steps of the GPU set (at batch 2) and of the core
# set on this CPU. Needs the package registry; about 10 minutes on 2 cores.
#   bash benchmarks/kit_versions.sh OUT [ENV.json] [VENV]
# Exits non-zero where a step failed or a model was skipped; OUT/*.log say why.
set -uo pipefail
OUT=${1:?usage: kit_versions.sh OUT [ENV.json] [VENV]}
cd "$(dirname "$0")/.."
ENV=${2:-$(for f in data/*/env.json; do echo "$(git log -1 --format=%ct -- "$f") $f"; done \
             | sort -n | tail -1 | cut -d' ' -f2)}
V=${3:-/tmp/mdot-kit-venv}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PINS=$(python - "$ENV" <<'EOF'
import json, sys
have = json.load(open(sys.argv[1]))["packages"]
pins = [f"{n}=={have[n]}" for n in ("torch", "torchvision", "transformers", "timm")]
# kits before it was recorded: the huggingface-hub transformers 5 takes
print(" ".join(pins + [f"huggingface-hub=={have['huggingface-hub']}" if have.get(
    "huggingface-hub") else "huggingface-hub<2"]))
EOF
) || { echo "kit_versions: no packages in $ENV"; exit 2; }
echo "versions of $ENV: $PINS" | tee "$OUT/versions.log"
[ -x "$V/bin/python" ] || python -m venv --system-site-packages "$V"
# --no-deps: the rest as this machine has it; no constraint: ours pins this machine's torch
# shellcheck disable=SC2086
PIP_CONSTRAINT= "$V/bin/pip" install -q --no-deps $PINS >> "$OUT/versions.log" 2>&1 \
  || { echo "kit_versions: pip failed (versions.log)"; exit 2; }
"$V/bin/python" -c "import torch, transformers, timm; print(torch.__version__,
  transformers.__version__, timm.__version__)" | tee -a "$OUT/versions.log" || exit 2
failed=0
PYTHON="$V/bin/python" KIT_WORK="$OUT/work" bash benchmarks/gpu_kit.sh --dry-run "$OUT/kit"
grep -q "== exit [^0]" "$OUT/kit/kit.log" && { echo "kit_versions: a dry-run step failed"; failed=1; }
export PYTHONPATH="$PWD" MDOT_DATA="$OUT/work" TQDM_DISABLE=1
mdot() { "$V/bin/python" -c 'import sys; from mdot_jax.cli import main; sys.exit(main(sys.argv[1:]))' "$@"; }
GPU_SET=$(sed -n 's/^  GPU_MODELS+\{0,1\}=,\{0,1\}//p' benchmarks/gpu_kit.sh | paste -sd,)
for what in gpu-set core-set; do
  if [ "$what" = gpu-set ]; then
    args=(--zoo torchvision,timm,hf --models "$GPU_SET" --image-sizes 224 --seq-lens 256
          --batch-sizes 2)
  else
    args=(--core-set)
  fi
  mdot profile "${args[@]}" --precision amp-bf16 --threads 2 --trace \
    --out "$OUT/work/$what" > "$OUT/$what.log" 2>&1 || failed=1
  skipped=$(python -c "import json, sys; r = json.load(open(sys.argv[1]))
print(len(r['skipped']), r['skipped_by_reason'])" "$OUT/work/$what/report.json" 2>/dev/null \
    || echo "? (no report.json)")
  echo "kit_versions: $what: $(tail -1 "$OUT/$what.log" | tr '\r' '\n' | tail -1)"
  [ "${skipped%% *}" = 0 ] || { echo "kit_versions: $what skipped $skipped (report.json)"; failed=1; }
done
exit $failed
