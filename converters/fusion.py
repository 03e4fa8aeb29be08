"""Eager-kernel fusion: rewrite what the exporter decomposes but eager PyTorch runs as one
kernel (or not at all), so an operator sequence counts the kernels that actually run.

- exact GELU  `Div(x, sqrt 2) -> Erf -> Add(., 1) -> Mul(x, .) -> Mul(., 0.5)`  => `Gelu(x)`
- (version 3) tanh GELU as the TorchScript exporter writes `gelu(x, approximate="tanh")` (one
  kernel in eager PyTorch; Gemma's, StarCoder's and SigLIP's `gelu_pytorch_tanh`):
  `Mul(x, x) -> Mul(x, .) -> Mul(., 0.044715) -> Add(x, .) -> Mul(., sqrt(2/pi)) -> Tanh ->
  Add(., 1) -> Mul(x, .) -> Mul(., 0.5)`                                         => `Gelu(x)`;
  Python arithmetic that computes the same (transformers' `gelu_new`: `Pow(x, 3)`, `0.5 * x`
  first) runs as its kernels and stays
- (version 3) Slices that cut one tensor along one axis into equal pieces covering it (the
  dynamo exporter's `unbind`, `chunk`)                                              => one `Split`,
  as the TorchScript exporter writes them (one kernel, not one a piece each reading it all);
  unequal pieces stay (Mamba's projection, whose fused kernels read theirs in place)
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
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from converters.errors import ConversionError
from converters.vocab import op_id

VIEWS = frozenset(("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"))
FUSION_VERSION = 3  # 1: GELU, SiLU, no-op Dropout, views; 2: + in-graph running statistics;
# 3: + tanh GELU, Slices tiling a tensor
ADDED = {2: ("batch_stats",), 3: ("gelu_tanh", "slices")}  # a version -> its rules' count keys


def fusion_version(fuse: bool | int) -> int:
    """The version a `fuse` argument asks for: `True` the latest, `False` 0 (none)."""
    version = FUSION_VERSION if fuse is True else int(fuse)
    if not 0 <= version <= FUSION_VERSION:
        raise ConversionError(f"fusion version {version}: this converter knows versions 1 to "
                              f"{FUSION_VERSION} (0: none)" + (" (a newer mdot wrote it?)"
                                                               if version > 0 else ""))
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
         version: int = FUSION_VERSION,
         shape_of: Callable[[str], Sequence[int] | None] = lambda t: None
         ) -> tuple[list[Node], dict[str, int]]:
    """The rewritten node list (same order) and how many of each pattern were fused, with
    the rules of `version`; `shape_of`: a tensor's concrete shape, where known."""
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
    counts = {"gelu": 0, "silu": 0, "dropout": 0, "batch_stats": 0, "gelu_tanh": 0,
              "slices": 0}

    def make(op_type: str, at: int, inputs: list[str], outs: list[str]) -> Node:
        name = nodes[at].name or f"{op_type}_{at}"
        return Node(op_type, name, inputs, outs, onnx.helper.make_node(
            op_type, inputs, outs, name=name))

    def halved(i: int, x: str, chain: list[int]) -> bool:
        """GELU's last three nodes after node `i`, `Add(., 1) -> Mul(x, .) -> Mul(., 0.5)`:
        if there, they and `chain` (the nodes up to `i`) become `Gelu(x)`."""
        add = sole(nodes[i].outputs[0], "Add")
        if add is None or not near(other(nodes[add], nodes[i].outputs[0]) or "", 1.0):
            return False
        mul = sole(nodes[add].outputs[0], "Mul")
        if mul is None or other(nodes[mul], nodes[add].outputs[0]) != x:
            return False
        half = sole(nodes[mul].outputs[0], "Mul")
        if half is None or not near(other(nodes[half], nodes[mul].outputs[0]) or "", 0.5):
            return False
        removed.update((*chain, add, mul))
        replaced[half] = make("Gelu", half, [x], [nodes[half].outputs[0]])
        return True

    def fed(t: str | None, op_type: str) -> int | None:
        """The node that produces `t` if it is an `op_type` node."""
        j = producer.get(t or "")
        return j if j is not None and nodes[j].op_type == op_type else None

    def gelu(i: int) -> bool:
        div = fed(nodes[i].inputs[0], "Div")
        if div is None or len(nodes[div].inputs) != 2 \
                or not near(nodes[div].inputs[1], math.sqrt(2)) \
                or sole(nodes[div].outputs[0], "Erf") != i:
            return False
        return halved(i, nodes[div].inputs[0], [div, i])

    def scaled(at: int | None, target: float) -> str | None:
        """The other input of binary node `at` whose one input is the constant `target`."""
        if at is None or len(nodes[at].inputs) != 2:
            return None
        a, b = nodes[at].inputs
        return b if near(a, target) else a if near(b, target) else None

    def gelu_tanh(i: int) -> bool:
        # back from the Tanh: Mul(., sqrt(2/pi)) <- Add(x, .) <- Mul(., 0.044715) <- Mul(x, .)
        # <- Mul(x, x), each intermediate read by the next alone
        inner = fed(nodes[i].inputs[0], "Mul")
        add = fed(scaled(inner, math.sqrt(2 / math.pi)), "Add")
        if inner is None or add is None:
            return False
        for x in nodes[add].inputs:  # x and the scaled cube, either order
            scale = fed(other(nodes[add], x), "Mul")
            cube = fed(scaled(scale, 0.044715), "Mul")
            square = fed(other(nodes[cube], x) if cube is not None else None, "Mul")
            if scale is not None and cube is not None and square is not None \
                    and nodes[square].inputs == [x, x]:
                chain = [square, cube, scale, add, inner, i]
                break
        else:
            return False
        return all(sole(nodes[a].outputs[0], nodes[b].op_type) == b
                   for a, b in zip(chain, chain[1:])) and halved(i, x, chain)

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

    def cut(j: int) -> tuple[int, int, int] | None:
        """(axis, start, end) of Slice `j` if it cuts one axis by constants with step 1."""
        ins = [*nodes[j].inputs, "", "", ""][1:5]  # starts, ends, axes, steps
        got = [consts.get(t) if t else None for t in ins]
        if any(t and (v is None or v.size != 1) for t, v in zip(ins, got)):
            return None  # not a constant, or more than one axis
        starts, ends, axes, steps = (None if v is None else int(v.reshape(-1)[0]) for v in got)
        if starts is None or ends is None or steps not in (None, 1):
            return None
        return axes or 0, starts, ends

    def slices(i: int) -> bool:
        x = nodes[i].inputs[0]
        group = [j for j in consumers[x] if nodes[j].op_type == "Slice"]
        if group[0] != i or len(group) < 2:  # the first of two or more
            return False
        cuts = [c for c in map(cut, group) if c is not None]
        shape = shape_of(x)
        if len(cuts) < len(group) or not shape or len(shape) < 2 \
                or len({c[0] % len(shape) for c in cuts}) != 1:
            return False  # (rank 1: shape arithmetic, dropped anyway)
        axis = cuts[0][0] % len(shape)
        dim = shape[axis]
        at = lambda v: min(max(v + dim if v < 0 else v, 0), dim)  # noqa: E731  ONNX's rule
        spans = sorted((at(start), at(end), j) for (_, start, end), j in zip(cuts, group))
        if spans[0][0] != 0 or spans[-1][1] != dim or len({b - a for a, b, _ in spans}) > 1 \
                or any(a[1] != b[0] for a, b in zip(spans, spans[1:])):
            return False  # not equal pieces that cover the axis once
        outs = [nodes[j].outputs[0] for _, _, j in spans]
        removed.update(j for j in group if j != i)
        replaced[i] = Node("Split", nodes[i].name, [x], outs, onnx.helper.make_node(
            "Split", [x], outs, name=nodes[i].name, axis=axis))
        return True

    patterns: dict[str, tuple[str, Callable[[int], bool]]] = {
        "Erf": ("gelu", gelu), "Sigmoid": ("silu", silu), "Dropout": ("dropout", dropout)}
    if version >= 2:
        patterns["BatchNormalization"] = ("batch_stats", batch_stats)
    if version >= 3:
        patterns["Tanh"] = ("gelu_tanh", gelu_tanh)
        patterns["Slice"] = ("slices", slices)
    for i, n in enumerate(nodes):
        if n.op_type in patterns and i not in removed and i not in replaced:
            key, match = patterns[n.op_type]
            counts[key] += match(i)
    fused = [replaced.get(i, n) for i, n in enumerate(nodes) if i not in removed]
    return fused, {k: v for k, v in counts.items() if v}


def _no_computed_batch_statistics(seq: Any) -> bool:
    """Fusion 2 drops only what feeds a training BatchNormalization's statistics inputs: a
    sequence none of whose BatchNormalizations reads more than one operator has none."""
    bn = np.flatnonzero(seq.op_type == op_id("BatchNormalization"))
    return all(len(np.unique(seq.edges[seq.edges[:, 1] == j, 0])) <= 1 for j in bn)


def _no_tanh_or_slices_of_one_tensor(seq: Any) -> bool:
    """Fusion 3 fuses only chains through a Tanh and Slices (two or more) of one tensor."""
    slices = np.flatnonzero(seq.op_type == op_id("Slice"))
    read = [tuple(seq.edges[seq.edges[:, 1] == j, 0]) for j in slices]  # () the graph's input
    return not np.any(seq.op_type == op_id("Tanh")) and len(set(read)) == len(read)


# fusion version -> it changes nothing if
_UNCHANGED_BY = {2: _no_computed_batch_statistics, 3: _no_tanh_or_slices_of_one_tensor}


def converts_the_same(seq: Any, fuse: int) -> bool:
    """Whether converting `seq`'s (an `OperatorSequence`) graph at fusion version `fuse` gives
    `seq` itself, so that a copy or a predictor of that version may take it: a newer one
    where the rules added since its version do not apply to it, an older one where none of
    the rules added after `fuse` fused anything in it. A sequence at the same version is
    never reused: converting again is how a converter's fixes reach a dataset."""
    have = seq.fusion
    if 1 <= fuse < have:
        return not any(seq.meta["fused"].get(k) for v in range(fuse + 1, have + 1)
                       for k in ADDED[v])
    return 1 <= have < fuse and all(
        v in _UNCHANGED_BY and _UNCHANGED_BY[v](seq) for v in range(have + 1, fuse + 1))
