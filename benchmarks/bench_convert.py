"""Conversion speed: ops/second of ONNX -> OperatorSequence, excluding ONNX shape inference.

    python benchmarks/bench_convert.py [--repeats 5]

Prints one table: a large real graph (torchvision maxvit_t, ~1.6k ops, needs the torch extra)
and generated residual graphs of 12.5k, 25k and 50k ops (target >= 50k ops/s), with the
median and spread of the repeats, shape-inference time separately, and the peak Python memory
of the conversion (tracemalloc) per op, which should stay flat as the graph grows.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np
from onnx import TensorProto, helper

from converters import from_torch, load_model, to_sequence


def residual_graph(num_ops: int, channels: int = 16, size: int = 8):
    """A generated chain of Conv -> BatchNorm -> Relu -> Add blocks with about `num_ops` ops."""
    nodes, inputs = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                       ["N", channels, size, size])]
    prev = "x"
    for b in range(num_ops // 4):
        w, names = f"w{b}", [f"s{b}", f"b{b}", f"m{b}", f"v{b}"]
        inputs.append(helper.make_tensor_value_info(w, TensorProto.FLOAT,
                                                    [channels, channels, 3, 3]))
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [channels])
                   for n in names]
        nodes += [
            helper.make_node("Conv", [prev, w], [f"c{b}"], name=f"conv{b}",
                             kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"c{b}"] + names, [f"n{b}"],
                             name=f"bn{b}"),
            helper.make_node("Relu", [f"n{b}"], [f"r{b}"], name=f"relu{b}"),
            helper.make_node("Add", [f"r{b}", prev], [f"a{b}"], name=f"add{b}"),
        ]
        prev = f"a{b}"
    graph = helper.make_graph(nodes, f"residual{num_ops}", inputs,
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.metadata_props.add(key="mdot.data_inputs", value="x")
    return model


def measure(name, model, repeats, batch_size=2):
    t0 = time.perf_counter()
    inferred = load_model(model, batch_size=batch_size)
    infer_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        seq = to_sequence(inferred, name=name)
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    to_sequence(inferred, name=name)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    med = statistics.median(times)
    iqr = np.subtract(*np.percentile(times, [75, 25]))
    return dict(graph=name, ops=seq.num_ops, median_s=med, iqr_s=float(iqr),
                ops_per_s=seq.num_ops / med, infer_s=infer_s, peak_bytes_per_op=peak / seq.num_ops)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    try:
        import torch
        import torchvision
        model = from_torch(torchvision.models.get_model("maxvit_t"),
                           torch.randn(2, 3, 224, 224), input_names=["x"])
        rows.append(measure("maxvit_t (torchvision)", model, args.repeats))
    except ImportError:
        print("torch not installed: skipping the real graph")
    for n in (12_500, 25_000, 50_000):
        rows.append(measure(f"generated {n // 1000}k", residual_graph(n), args.repeats))
    print(f"{'graph':<24} {'ops':>7} {'median s':>9} {'IQR s':>7} {'ops/s':>9} "
          f"{'infer s':>8} {'peak B/op':>10}")
    for r in rows:
        print(f"{r['graph']:<24} {r['ops']:>7} {r['median_s']:>9.3f} {r['iqr_s']:>7.3f} "
              f"{r['ops_per_s']:>9.0f} {r['infer_s']:>8.2f} {r['peak_bytes_per_op']:>10.0f}")
    print("target: >= 50,000 ops/s excluding shape inference; peak B/op flat = memory linear")


if __name__ == "__main__":
    main()
