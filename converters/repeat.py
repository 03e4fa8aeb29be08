"""A deep stack of identical layers exported once and repeated in the ONNX graph.

Tracing a 70B decoder's 80 layers through PyTorch's exporter takes half a minute and a GB of
memory to write the same layer 80 times. When every layer after the first is the same module
(class, shapes and settings; only its index differs), the model is exported with its first two
layers and layer 1's nodes are copied once per missing layer: each copy reads its own
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


def template(layers: Any, config: Any) -> int | None:
    """The layer the stack's last ones repeat, copied in the graph for them: layer 1 where
    layers 2.. are layer 1 again (layer 0 may differ), else the second of the run of identical
    layers that ends the stack (a mixture of experts' first dense layers stand before it, all
    traced); None where no layer would be copied or a config field listing a value per layer
    (e.g. `layer_types`) differs among them."""
    sigs = [_signature(layer) for layer in layers]
    first = len(sigs) - 1  # of the run of identical layers that ends the stack
    while first > 0 and sigs[first - 1] == sigs[-1]:
        first -= 1
    t = 1 if first <= 1 else first + 1
    fields = config.to_dict() if hasattr(config, "to_dict") else {}
    if t + 1 >= len(layers) or any(isinstance(v, list) and len(v) == len(layers)
                                   and any(x != v[t] for x in v[t + 1:])
                                   for v in fields.values()):
        return None
    return t


def repeat_layer(model: onnx.ModelProto, stack: str, count: int, src: int = 1) -> None:
    """Copies layer `src` of a graph exported with layers 0..src of the `ModuleList` named
    `stack` (e.g. `model.layers`) until it has `count`. In place; a ConversionError if layer
    src does not read layer src - 1's output as the layers after it read its own."""
    graph = model.graph
    scope = "/" + stack.replace(".", "/")  # the exporter's node scopes: /model/layers.1/...
    s0, s1 = f"{scope}.{src - 1}/", f"{scope}.{src}/"
    p1 = f"{stack}.{src}."
    nodes = list(graph.node)
    ones = [i for i, n in enumerate(nodes) if s1 in n.name]
    if not ones:
        raise ConversionError(f"{stack}: no node of layer {src} in the exported graph")
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for i in ones for a in nodes[i].attribute):
        raise ConversionError(f"{stack}: layer {src} holds a subgraph: its layers cannot be "
                              "repeated")
    last = ones[-1]
    layer = [nodes[i] for i in ones]
    made = {o for n in layer for o in n.output}
    after = nodes[last + 1:]
    leaving = {t for n in after for t in n.input if t in made} | \
              {o.name for o in graph.output if o.name in made}
    produced0 = {o for n in nodes if s0 in n.name for o in n.output}
    carried = {}  # layer 0's tensor -> layer 1's, the stream one layer hands the next
    for n in layer:
        for t in n.input:
            if t in produced0 and t.replace(s0, s1) in leaving:
                carried[t] = t.replace(s0, s1)
    if set(carried.values()) != leaving:
        raise ConversionError(f"{stack}: layer {src} hands on "
                              f"{sorted(leaving - set(carried.values()))} that layer {src - 1} "
                              "does not: its layers cannot be repeated")

    def renamed(t: str, k: int) -> str:
        return t.replace(s1, f"{scope}.{k}/") if s1 in t else f"{scope}.{k}/{t}"

    def weight(t: str, k: int) -> str:  # layer 1's parameter `t` as layer k's
        return f"{stack}.{k}." + t[len(p1):]

    copies: list[onnx.NodeProto] = []
    for k in range(src + 1, count):
        for n in layer:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = n.name.replace(s1, f"{scope}.{k}/")
            for j, t in enumerate(n.input):
                if t in made:
                    c.input[j] = renamed(t, k)
                elif t in carried:
                    c.input[j] = renamed(carried[t], k - 1)
                elif t.startswith(p1):
                    c.input[j] = weight(t, k)
            for j, t in enumerate(n.output):
                c.output[j] = renamed(t, k)
            copies.append(c)
    for n in after:
        for j, t in enumerate(n.input):
            if t in leaving:
                n.input[j] = renamed(t, count - 1)
    for o in graph.output:
        if o.name in leaving:
            o.name = renamed(o.name, count - 1)
    del graph.node[:]
    graph.node.extend(nodes[:last + 1] + copies + after)

    inputs = list(graph.input)
    params1 = [i for i, v in enumerate(inputs) if v.name.startswith(p1)]
    extra = []
    for k in range(src + 1, count):
        for i in params1:
            v = onnx.ValueInfoProto()
            v.CopyFrom(inputs[i])
            v.name = weight(v.name, k)
            extra.append(v)
    at = params1[-1] + 1 if params1 else len(inputs)
    del graph.input[:]
    graph.input.extend(inputs[:at] + extra + inputs[at:])
