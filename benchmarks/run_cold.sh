#!/usr/bin/env bash
# docs/operators.md, section 12 (rule written before this script ran): every measured
# operator once more with the caches evicted before each call, the kernel cost model on those
# labels, and the confirming runs on the folds of section 7. Resumable: every step skips what
# is done. The first step is a measurement: nothing else may run on the machine meanwhile
# (MINUTES bounds it; run the script again to go on).
#   nohup bash benchmarks/run_cold.sh > /tmp/cold.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
SLUG=${SLUG:-cpu-amd-epyc-f25m17-2t}
if [ "$(python -c 'from mdot_jax.data.profile import fingerprint, device_slug
print(device_slug(fingerprint(2)))')" != "$SLUG" ]; then
  echo "this machine is not $SLUG: its operators cannot be measured here" >&2; exit 1
fi
mdot profile --ops --ops-cold ${MINUTES:+--max-minutes $MINUTES}
left=$(python -c "
from mdot_jax.ops.profile import COLD, again_order, read_op_samples, read_plan
from mdot_jax.ops.specs import OpSpec
from pathlib import Path
import json
root = Path('data/$SLUG/ops')
done = {d['key'] for d in read_op_samples(root)}
cold = {json.loads(x)['key'] for x in (root / COLD).read_text().splitlines() if x.strip()}
print(sum(OpSpec.from_json(d['spec']).key not in cold
          for d in again_order(read_plan(root), done, 0) if not d.get('extension')))")
if [ "$left" != 0 ]; then echo "$left operators of the first plan not measured cold yet"; exit 0; fi
OPS=data/derived/$SLUG-ops-cold
[ -f "$OPS/samples.jsonl" ] || python benchmarks/two_pass_ops.py "data/$SLUG/ops" --first-plan \
  --cold --out "$OPS"
[ -f "benchmarks/results/kernels-$SLUG-cold/results.json" ] || \
  python benchmarks/bench_kernels.py "$OPS" --models "data/derived/$SLUG-fused" \
    --out "benchmarks/results/kernels-$SLUG-cold"
OUT=benchmarks/results/$SLUG-fused-v2-ops-cold-family
. benchmarks/ops_runs.sh
confirm gnn+lightgbm+op-sum,gnn+lightgbm,op-sum,lightgbm
