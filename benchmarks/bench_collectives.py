"""The collectives' two NVLink constants, fitted on XLA's measured H100 collectives.

    python benchmarks/bench_collectives.py ../shared/datasets/xla-h100-tables \
        --out benchmarks/results/collectives-h100

The data (credit: the OpenXLA authors, `xla/service/gpu/model/collective_interpolator_data.h`,
Apache-2.0; read from `../shared/datasets/xla-h100-tables/`, never copied here): all-reduce,
all-gather and reduce-scatter of 1 KiB-2 GiB over one group of 8 H100s (sm_90), measured.

The rule, written before the fit: a ring collective over N GPUs takes steps x latency +
(bytes each GPU moves) / (efficiency x the link's bandwidth per direction), steps 2 (N - 1)
for an all-reduce and N - 1 for the others, bytes 2 (N - 1) / N and (N - 1) / N of the tensor.
`latency` and `efficiency` are fitted by least squares on the relative error, on the sizes
training moves (1 MiB and more), and become `parallel.LATENCY_US["nvlink"]` and
`parallel.NVLINK_EFFICIENCY`. Reported: MAPE per collective before (the datasheet link, 2 us a
step) and after. PCIe and networks keep their datasheet figures (nothing measured of them).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

N = 8


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from mdot_jax.gpu import catalog
    from mdot_jax.gpu.parallel import LATENCY_US, NVLINK_EFFICIENCY

    link_gbs = catalog.find("h100-sxm").nvlink_gbs / 2  # per direction
    with open(args.data / "collectives.csv") as f:
        rows = [r for r in csv.DictReader(f) if int(r["num_devices_per_group"]) == N
                and int(r["tensor_size_bytes"]) >= 2 ** 20]
    ops = np.asarray([r["opcode"] for r in rows])
    size = np.asarray([float(r["tensor_size_bytes"]) for r in rows])
    measured = size / np.asarray([float(r["network_throughput_bytes_per_sec"]) for r in rows])
    twice = np.where(ops == "all-reduce", 2.0, 1.0)
    steps, moved = twice * (N - 1), twice * (N - 1) / N * size  # [rows]
    a = np.c_[steps, moved / (link_gbs * 1e9)] / measured[:, None]
    latency, inverse = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)[0]

    def mape(lat_s: float, eff: float) -> dict:
        ape = np.abs((steps * lat_s + moved / (eff * link_gbs * 1e9)) / measured - 1)
        return {op: float(100 * ape[ops == op].mean()) for op in sorted(set(ops))}

    result = dict(
        source="OpenXLA, xla/service/gpu/model/collective_interpolator_data.h (sm_90, 8 GPUs)",
        rows=len(rows), link_gbs_per_direction=link_gbs,
        fitted=dict(latency_us=float(latency * 1e6), efficiency=float(1 / inverse)),
        shipped=dict(latency_us=LATENCY_US["nvlink"], efficiency=NVLINK_EFFICIENCY),
        mape_datasheet=mape(2e-6, 1.0), mape_shipped=mape(LATENCY_US["nvlink"] * 1e-6,
                                                          NVLINK_EFFICIENCY))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
