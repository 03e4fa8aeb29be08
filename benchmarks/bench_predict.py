"""Prediction latency: warm end-to-end (load ONNX + convert + predict) and forward alone.

    python benchmarks/bench_predict.py [--checkpoint NAME|DIR] [--repeats 20]

Uses a torchvision ResNet-50 exported once (weight-free) at 224 px, batch size 64.
Targets: end-to-end <= 100 ms, predictor forward alone <= 5 ms (medians of warm repeats).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx


def timed(fn, repeats: int) -> tuple[float, float]:
    fn()  # warm-up (compilation)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    q75, q25 = np.percentile(times, [75, 25])
    return statistics.median(times), float(q75 - q25)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    import jax
    import torch
    import torchvision

    from converters import convert, from_torch
    from mdot_jax.data.dataset import Sample
    from mdot_jax.data.features import FeatureCache
    from mdot_jax.serving.predict import Predictor

    predictor = Predictor.load(args.checkpoint)
    path = Path(tempfile.mkdtemp()) / "resnet50.onnx"
    onnx.save(from_torch(torchvision.models.resnet50(), torch.randn(2, 3, 224, 224)), path)

    def end_to_end():
        return predictor.predict(path, batch_size=64).iteration_ms

    seq = convert(path, batch_size=64)
    w = predictor._workload(64, 224, None, "nchw", None, "sgd")
    cache = FeatureCache(predictor.trained.stats, predictor.trained.feature_cfg,
                         predictor.trained.model_cfg.vocab_size)
    batch, _ = next(cache.batches([Sample.in_memory(seq, w)], 4096, shrink=True))

    def forward():
        return jax.block_until_ready(predictor._forward(predictor._params, batch))

    def convert_only():
        return convert(path, batch_size=64)

    rows = [("end to end (load+convert+predict)", *timed(end_to_end, args.repeats), 100.0),
            ("convert only (load+infer+sequence)", *timed(convert_only, args.repeats), None),
            ("predictor forward alone", *timed(forward, args.repeats), 5.0)]
    print(f"checkpoint: {predictor.path}; ResNet-50, batch 64, {seq.num_ops} operators; "
          f"prediction {end_to_end():.1f} ms/iteration")
    print(f"{'what':<38} {'median ms':>10} {'IQR ms':>8} {'target ms':>10}")
    for name, med, iqr, target in rows:
        print(f"{name:<38} {med:>10.2f} {iqr:>8.2f} {target if target else '-':>10}")


if __name__ == "__main__":
    main()
