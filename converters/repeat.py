"""A deep stack of identical layers exported once and repeated in the ONNX graph.

Tracing a 70B decoder's 80 layers through PyTorch's exporter takes half a minute and a GB of
memory to write the same layer 80 times. When every layer after the first is the same module
(class, shapes and settings; only its index differs), the model is exported with its first two
layers and layer 1's nodes are copied once per missing layer (a stack alternating kinds of
layers in a pattern: the pattern's layers in turn): each copy reads its own
parameters (`...layers.K.weight`), the layer before it's output in place of layer 0's, and the
constants and shared tensors (masks, rotary tables) layer 1 reads; what read the last layer's
output reads the last copy's. The result is the graph the full export gives, up to which
Constant node holds a value (tests compare the two).
"""

from __future__ import annotations

from typing import Any

import onnx

from converters.errors import ConversionError

_SCALARS = (bool, int, float, str, type(None))
_INDEX_LIKE = ("idx", "index", "layer_id", "layer_number")  # a layer's own position


def layer_stack(model: Any, count: int) -> tuple[str, Any] | None:
    """The outermost `ModuleList` of `model` holding its `count` layers (its qualified name, the
    list); None if it has none or `count` < 3. By count, not length: a mixture of experts'
    list of experts may be longer than the stack of layers."""
    import torch

    lists = [(name, m) for name, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) == count >= 3]
    return min(lists, key=lambda nm: nm[0].count("."), default=None)


def _signature(layer: Any) -> list:
    """What a layer computes, less its index: every submodule's class and scalar settings, every
    parameter's and buffer's shape and dtype."""
    sig: list = []
    for name, m in layer.named_modules():
        settings = sorted((k, v) for k, v in vars(m).items() if isinstance(v, _SCALARS)
                          and not any(s in k.lower() for s in _INDEX_LIKE))
        sig.append((name, type(m).__qualname__, settings))
    sig += [(n, tuple(t.shape), str(t.dtype)) for n, t in layer.named_parameters()]
    sig += [(n, tuple(t.shape), str(t.dtype)) for n, t in layer.named_buffers()]
    return sig


MAX_PERIOD = 8  # the longest pattern of layers a stack may repeat (Gemma 3's is 6)


def template(layers: Any, config: Any) -> tuple[int, int] | None:
    """(src, period): the stack's last layers repeat layers src - period + 1 .. src in turn,
    copied in the graph for them, layer src - period the same as src. A run of identical
    layers is period 1 (src 1 where layers 2.. are layer 1 again, layer 0 may differ); a stack
    alternating kinds (gpt-oss's sliding and full attention, Qwen3-Next's three linear
    attention layers and one softmax, each layer's module and its value in every config field
    listing one a layer) the shortest period, src where the copies end on it. None where no
    layer would be copied."""
    fields = config.to_dict() if hasattr(config, "to_dict") else {}
    lists = [v for v in fields.values() if isinstance(v, list) and len(v) == len(layers)]
    kinds = [(_signature(layer), [repr(v[k]) for v in lists]) for k, layer in enumerate(layers)]
    n, best = len(layers), None
    for period in range(1, min(MAX_PERIOD, n // 2) + 1):
        first = n - period  # the periodic tail: kinds[k] == kinds[k + period] from `first`
        while first > 0 and kinds[first - 1] == kinds[first - 1 + period]:
            first -= 1
        src = period if first <= 1 else first + period
        src += (n - 1 - src) % period  # the last copy is src's
        if src + 1 < n and (best is None or src < best[0]):
            best = (src, period)
    return best


def repeat_layer(model: onnx.ModelProto, stack: str, count: int, src: int = 1,
                 period: int = 1) -> dict[int, int]:
    """Copies layers src - period + 1 .. src of a graph exported with layers 0..src of the
    `ModuleList` named `stack` (e.g. `model.layers`) in turn until it has `count` (count - 1 -
    src a multiple of `period`). In place; returns {copy: the layer it copies}; a
    ConversionError if layer src does not hand on what layer src - period does (the stream
    the block's first layer reads)."""
    if (count - 1 - src) % period:
        raise ConversionError(f"{stack}: {count} layers do not end on layer {src}'s kind, "
                              f"repeating layers {src - period + 1}..{src}")
    graph = model.graph
    scope = "/" + stack.replace(".", "/")  # the exporter's node scopes: /model/layers.1/...

    def at(k: int) -> str:
        return f"{scope}.{k}/"

    nodes = list(graph.node)
    block = range(src - period + 1, src + 1)
    ones = {j: [i for i, n in enumerate(nodes) if at(j) in n.name] for j in block}
    for j, idx in ones.items():
        if not idx:
            raise ConversionError(f"{stack}: no node of layer {j} in the exported graph")
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for i in idx for a in nodes[i].attribute):
            raise ConversionError(f"{stack}: layer {j} holds a subgraph: its layers cannot be "
                                  "repeated")
    last = ones[src][-1]
    made = {j: {o for i in idx for o in nodes[i].output} for j, idx in ones.items()}
    after = nodes[last + 1:]
    leaving = {t for n in after for t in n.input if t in made[src]} | \
              {o.name for o in graph.output if o.name in made[src]}
    before = at(src - period)  # the layer the block's first reads, as src hands on
    produced = {o for n in nodes if before in n.name for o in n.output}
    carried = {t for i in ones[block[0]] for t in nodes[i].input
               if t in produced and t.replace(before, at(src)) in leaving}
    if {t.replace(before, at(src)) for t in carried} != leaving:
        raise ConversionError(f"{stack}: layer {src} hands on "
                              f"{sorted(leaving - {t.replace(before, at(src)) for t in carried})}"
                              f" that layer {src - period} does not: its layers cannot be "
                              "repeated")

    def renamed(t: str, j: int, k: int) -> str:  # layer j's tensor `t` as layer k's
        return t.replace(at(j), at(k)) if at(j) in t else f"{at(k)}{t}"

    def weight(t: str, j: int, k: int) -> str:  # layer j's parameter `t` as layer k's
        return f"{stack}.{k}." + t[len(f"{stack}.{j}."):]

    copies: list[onnx.NodeProto] = []
    sources = {k: block[(k - src - 1) % period] for k in range(src + 1, count)}
    for k, j in sources.items():
        for i in ones[j]:
            n = nodes[i]
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = n.name.replace(at(j), at(k))
            for m, t in enumerate(n.input):
                if t in made[j]:
                    c.input[m] = renamed(t, j, k)
                elif j > block[0] and t in made[j - 1]:  # the block's layer before it
                    c.input[m] = renamed(t, j - 1, k - 1)
                elif t in carried:
                    c.input[m] = renamed(t.replace(before, at(src)), src, k - 1)
                elif t.startswith(f"{stack}.{j}."):
                    c.input[m] = weight(t, j, k)
            for m, t in enumerate(n.output):
                c.output[m] = renamed(t, j, k)
            copies.append(c)
    for n in after:
        for m, t in enumerate(n.input):
            if t in leaving:
                n.input[m] = renamed(t, src, count - 1)
    for o in graph.output:
        if o.name in leaving:
            o.name = renamed(o.name, src, count - 1)
    del graph.node[:]
    graph.node.extend(nodes[:last + 1] + copies + after)

    inputs = list(graph.input)
    params = {j: [i for i, v in enumerate(inputs) if v.name.startswith(f"{stack}.{j}.")]
              for j in block}
    extra = []
    for k, j in sources.items():
        for i in params[j]:
            v = onnx.ValueInfoProto()
            v.CopyFrom(inputs[i])
            v.name = weight(v.name, j, k)
            extra.append(v)
    held = [i for idx in params.values() for i in idx]
    end = max(held) + 1 if held else len(inputs)
    del graph.input[:]
    graph.input.extend(inputs[:end] + extra + inputs[end:])
    return sources
