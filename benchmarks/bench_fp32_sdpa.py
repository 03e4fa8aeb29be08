"""The fp32 kit steps whose attention calls SDPA, priced eager and fused
(docs/studies/fp32-sdpa.md).

    python benchmarks/bench_fp32_sdpa.py OUT.json
"""

import json
import math
import sys

from converters.attention import attention_blocks, calling_sdpa
from mdot_jax.data.dataset import load_dataset
from mdot_jax.gpu import catalog
from mdot_jax.gpu.spec_sheet import load_step_model, price

SETS = {"gpu-nvidia-h100-80gb-hbm3-fp32-fused": "h100 sxm",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-fp32-fused": "h100 sxm",
        "gpu-nvidia-h100-80gb-hbm3-lease-2-confirm-fp32-fused": "h100 sxm",
        "gpu-nvidia-h200-fp32-fused": "h200 sxm"}


def main() -> None:
    model, out = load_step_model(), {}
    for name, device in SETS.items():
        gpu, rows = catalog.find(device), []
        for s in load_dataset(f"data/derived/{name}").samples:
            blocks = attention_blocks(s.seq)
            if not blocks or len(calling_sdpa(s.seq, blocks)) != len(blocks) \
                    or s.workload.precision != "fp32":
                continue
            eager, fused = (price(s.seq, gpu, model, precision="fp32", optimizer="sgd",
                                  fit=False, attention=a, blocks=blocks)
                            for a in ("eager", "flash"))
            rows.append(dict(model=s.arch, batch=s.workload.batch_size,
                             size=s.workload.input_size, measured_ms=s.label_ms,
                             eager_ms=eager.iteration_ms, fused_ms=fused.iteration_ms,
                             peak_gb=(s.stats.get("peak_mb") or math.nan) / 1e3,
                             eager_gb=eager.memory_gb, fused_gb=fused.memory_gb))
        out[name] = rows
        print(name, len(rows), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
