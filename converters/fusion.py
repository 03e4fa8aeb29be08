"""Eager-kernel fusion: rewrite what the exporter decomposes but eager PyTorch runs as one
kernel (or not at all), so an operator sequence counts the kernels that actually run.

- exact GELU  `Div(x, sqrt 2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5)`  => `Gelu(x)`
- SiLU/Swish  `Sigmoid(x) -> Mul(x, .)`                                          => `Silu(x)`
- `Dropout` with ratio 0 (e.g. `nn.Dropout(0.)`, which eager PyTorch returns untouched, or
  training_mode 0)                                                               => `Identity`
- `Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`, `Transpose` (`VIEWS`): eager PyTorch returns a
  view, no kernel runs; they stay in the sequence but move 0 bytes.
- (version 2) the running statistics a training-mode `BatchNormalization` is given when the
  framework had none (`F.batch_norm(x, None, None, training=True)`, as weight standardisation
  in NF-Nets and BiT calls it): the exporter computes them in the graph (`ReduceMean`, `Sub`,
  `Mul`, ...) only because ONNX requires the inputs, and eager PyTorch never runs them. Every
  node whose outputs reach nothing but those two inputs is dropped; the inputs then read the
  BN's scale and bias, which have their shape `[C]`, so its row is unchanged.

The intermediate tensors of a pattern must have this one consumer and not be graph outputs.
Opt-in (`to_sequence(..., fuse=True)`, or `fuse=N` for the rules of version N): sequences
with and without fusion, or of two versions, differ, so a predictor must be trained on the
kind it is given (checkpoints record the version and convert with it).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from converters.errors import ConversionError

VIEWS = frozenset(("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"))
FUSION_VERSION = 2  # 1: GELU, SiLU, no-op Dropout, views; 2: + in-graph running statistics


def fusion_version(fuse: bool | int) -> int:
    """The version a `fuse` argument asks for: `True` the latest, `False` 0 (none)."""
    version = FUSION_VERSION if fuse is True else int(fuse)
    if not 0 <= version <= FUSION_VERSION:
        raise ConversionError(f"fusion version {version}: this converter knows versions 1 to "
                              f"{FUSION_VERSION} (a newer mdot wrote it?)")
    return version


class Node(NamedTuple):
    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    proto: onnx.NodeProto


def constants(graph: onnx.GraphProto, max_size: int = 16,
              keep: Callable[[str, Sequence[int]], bool] | None = None) -> dict[str, np.ndarray]:
    """Small constant tensors by name: Constant nodes' values and initializers with data;
    `keep(name, dims)`: only those it accepts (decided before any is read)."""
    out = {}
    for init in graph.initializer:
        if int(np.prod(init.dims)) <= max_size and (init.raw_data or init.float_data
                                                   or init.int64_data or init.double_data) \
                and (keep is None or keep(init.name, init.dims)):
            out[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and (keep is None or keep(node.output[0], next(
                (a.t.dims for a in node.attribute if a.name == "value"), ()))):
            for a in node.attribute:
                if a.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(a.t)
                elif a.name in ("value_float", "value_int"):
                    out[node.output[0]] = np.asarray(onnx.helper.get_attribute_value(a))
    return out


def fuse(nodes: list[Node], consts: dict[str, np.ndarray], outputs: set[str],
         version: int = FUSION_VERSION) -> tuple[list[Node], dict[str, int]]:
    """The rewritten node list (same order) and how many of each pattern were fused, with
    the rules of `version`."""
    consumers: dict[str, list[int]] = defaultdict(list)
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for t in n.inputs:
            if t:
                consumers[t].append(i)
        for t in n.outputs:
            if t:
                producer[t] = i

    def sole(t: str, op_type: str) -> int | None:
        """The only consumer of `t` if it is an `op_type` node and `t` is internal."""
        c = consumers.get(t, [])
        ok = len(c) == 1 and t not in outputs and nodes[c[0]].op_type == op_type
        return c[0] if ok else None

    def value(t: str) -> float | None:
        v = consts.get(t)
        return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None

    def near(t: str, target: float) -> bool:
        v = value(t)
        return v is not None and abs(v - target) <= 1e-3 * abs(target)

    def other(n: Node, t: str) -> str | None:
        """The second input of binary node `n`, the first being `t`."""
        if len(n.inputs) != 2 or t not in n.inputs:
            return None
        return n.inputs[1] if n.inputs[0] == t else n.inputs[0]

    removed: set[int] = set()
    replaced: dict[int, Node] = {}
    counts = {"gelu": 0, "silu": 0, "dropout": 0, "batch_stats": 0}

    def make(op_type: str, at: int, inputs: list[str], outs: list[str]) -> Node:
        name = nodes[at].name or f"{op_type}_{at}"
        return Node(op_type, name, inputs, outs, onnx.helper.make_node(
            op_type, inputs, outs, name=name))

    def gelu(i: int) -> bool:
        div = producer.get(nodes[i].inputs[0])
        if div is None or nodes[div].op_type != "Div" or len(nodes[div].inputs) != 2 \
                or not near(nodes[div].inputs[1], math.sqrt(2)) \
                or sole(nodes[div].outputs[0], "Erf") != i:
            return False
        x = nodes[div].inputs[0]
        add = sole(nodes[i].outputs[0], "Add")
        if add is None or not near(other(nodes[add], nodes[i].outputs[0]) or "", 1.0):
            return False
        mul = sole(nodes[add].outputs[0], "Mul")
        if mul is None or other(nodes[mul], nodes[add].outputs[0]) != x:
            return False
        half = sole(nodes[mul].outputs[0], "Mul")
        if half is None or not near(other(nodes[half], nodes[mul].outputs[0]) or "", 0.5):
            return False
        removed.update((div, i, add, mul))
        replaced[half] = make("Gelu", half, [x], [nodes[half].outputs[0]])
        return True

    def silu(i: int) -> bool:
        x, s = nodes[i].inputs[0], nodes[i].outputs[0]
        mul = sole(s, "Mul")
        if mul is None or other(nodes[mul], s) != x or mul in replaced:
            return False
        removed.add(i)
        replaced[mul] = make("Silu", mul, [x], [nodes[mul].outputs[0]])
        return True

    def dropout(i: int) -> bool:
        n = nodes[i]
        ratio = value(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else 0.5
        training = value(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else 0.0
        mask_used = len(n.outputs) > 1 and n.outputs[1] and (consumers.get(n.outputs[1])
                                                             or n.outputs[1] in outputs)
        if mask_used or not (ratio == 0.0 or training == 0.0):
            return False
        replaced[i] = make("Identity", i, [n.inputs[0]], [n.outputs[0]])
        return True

    def batch_stats(i: int) -> bool:
        n = nodes[i]
        # training: the attribute (opset >= 14), or running statistics as outputs (before)
        training = any(a.name == "training_mode" and a.i for a in n.proto.attribute) \
            or len([t for t in n.outputs if t]) > 1
        if not training or len(n.inputs) != 5 or not all(n.inputs[1:3]):
            return False
        # nodes all of whose outputs reach only the statistics inputs, from those inputs back
        # in reverse topological order (ONNX lists nodes sorted), so that every consumer of a
        # node is decided before it
        stats, dead = set(n.inputs[3:5]), set()
        seen = {producer[t] for t in stats if t in producer}
        todo = [-j for j in seen]  # a max-heap of node indices
        heapq.heapify(todo)
        while todo:
            j = -heapq.heappop(todo)
            if j in removed or j in replaced:
                continue
            if all(t not in outputs and all(c in dead or (c == i and t in stats)
                                            for c in consumers.get(t, []))
                   for t in nodes[j].outputs if t):
                dead.add(j)
                for p in {producer[t] for t in nodes[j].inputs if t in producer} - seen:
                    seen.add(p)
                    heapq.heappush(todo, -p)
        if not any(producer.get(t) in dead for t in stats):
            return False
        removed.update(dead)
        replaced[i] = Node(n.op_type, n.name, [*n.inputs[:3], *n.inputs[1:3]], n.outputs,
                           n.proto)
        return True

    patterns: dict[str, tuple[str, Callable[[int], bool]]] = {
        "Erf": ("gelu", gelu), "Sigmoid": ("silu", silu), "Dropout": ("dropout", dropout)}
    if version >= 2:
        patterns["BatchNormalization"] = ("batch_stats", batch_stats)
    for i, n in enumerate(nodes):
        if n.op_type in patterns and i not in removed and i not in replaced:
            key, match = patterns[n.op_type]
            counts[key] += match(i)
    fused = [replaced.get(i, n) for i, n in enumerate(nodes) if i not in removed]
    return fused, {k: v for k, v in counts.items() if v}
