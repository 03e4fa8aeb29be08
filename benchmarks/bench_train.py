"""Training throughput: seconds per train step and operators per second, per bucket length.

    python benchmarks/bench_train.py --dataset DIR [--archs mdot,lstm,gnn,per_op]
        [--fusion transformer] [--d-model 32] [--tokens 4096] [--repeats 5]

Real batches from the dataset (the first batch of each bucket), warm-up step excluded
(compilation), median and IQR of `--repeats` steps. The epoch estimate multiplies each
bucket's step time by its number of batches in one epoch over the whole dataset.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
import optax
from flax import nnx


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--archs", default="mdot")
    parser.add_argument("--fusion", default="transformer")
    parser.add_argument("--pe", default="depth,laplacian")
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--attn-block", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", default="", help="only these bucket lengths (comma list)")
    parser.add_argument("--max-length", type=int, default=4096)
    args = parser.parse_args()

    from mdot_jax.data.dataset import load_dataset
    from mdot_jax.data.features import FeatureCache, FeatureConfig, fit_stats
    from mdot_jax.models import ModelConfig, build_model
    from mdot_jax.training.train import make_mesh, make_steps

    samples = [s for s in load_dataset(args.dataset).samples
               if s.seq.num_ops <= args.max_length]
    stats = fit_stats(samples)
    pe = tuple(p for p in args.pe.split(",") if p)
    fc = FeatureConfig(distances="distance_bias" in pe)
    cache = FeatureCache(stats, fc)
    per_bucket: dict[int, list] = {}
    for batch, _ in cache.batches(samples, args.tokens):
        per_bucket.setdefault(batch.op_type.shape[1], []).append(batch)
    workload_dim = per_bucket[min(per_bucket)][0].workload.shape[-1]
    print(f"{len(samples)} samples, devices {jax.devices()}")
    print(f"{'arch':<8} {'T':>5} {'B':>4} {'batches':>7} {'compile s':>9} {'step s':>7} "
          f"{'IQR':>6} {'ops/s':>8}")
    for arch in args.archs.split(","):
        cfg = ModelConfig(arch=arch, d_model=args.d_model, fusion=args.fusion, pe=pe,
                          attn_block=args.attn_block, workload_dim=workload_dim)
        graphdef, params = nnx.split(build_model(cfg, nnx.Rngs(0)), nnx.Param)
        tx = optax.adamw(1e-3)
        step, _, _ = make_steps(graphdef, tx, stats.target_std, "mse", make_mesh())
        epoch_s = 0.0
        lengths = {int(x) for x in args.lengths.split(",") if x} or set(per_bucket)
        for length, batches in sorted(per_bucket.items()):
            if length not in lengths:
                continue
            batch = batches[0]
            p, o = jax.tree.map(np.asarray, params), tx.init(params)
            t0 = time.perf_counter()
            p, o, loss = step(p, o, batch, jax.random.key(0))
            jax.block_until_ready(loss)
            compile_s = time.perf_counter() - t0
            times = []
            for r in range(args.repeats):
                t0 = time.perf_counter()
                p, o, loss = step(p, o, batch, jax.random.key(r))
                jax.block_until_ready(loss)
                times.append(time.perf_counter() - t0)
            med = float(np.median(times))
            iqr = float(np.subtract(*np.percentile(times, [75, 25])))
            B = batch.op_type.shape[0]
            epoch_s += med * len(batches)
            print(f"{arch:<8} {length:>5} {B:>4} {len(batches):>7} {compile_s:>9.1f} "
                  f"{med:>7.3f} {iqr:>6.3f} {B * length / med:>8.0f}")
        print(f"{arch:<8} estimated epoch (steps only): {epoch_s:.0f} s")


if __name__ == "__main__":
    main()
