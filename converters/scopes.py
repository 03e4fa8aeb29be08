"""Module scopes for the nodes of a dynamo export, named as the TorchScript exporter names them.

`torch.onnx.export(..., dynamo=True)` (PyTorch's default) names nodes by its own counters
(`node_linear_3`) and keeps each one's module path in its metadata (`pkg.torch.onnx.name_scopes`:
`['', 'model', 'model.layers.0', 'model.layers.0.mlp', 'linear_3']`, the last the traced call).
The TorchScript exporter names a node by that path and its type, numbered within the path
(`/model/layers.0/mlp/Gemm`, then `Gemm_1`): the names that layers, their sublayers and
`--top`'s stacks are read from (`converters.attention`).
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Sequence

import onnx

SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def scoped_names(protos: Sequence[onnx.NodeProto]) -> dict[str, str]:
    """Node name -> its TorchScript-style name, for each node holding `SCOPES_KEY` whose name
    is not a path already (`/...`); names stay unique within the graph."""
    taken = {p.name for p in protos}
    numbered: Counter = Counter()
    out: dict[str, str] = {}
    for p in protos:
        scope = _scope(p)
        if scope is None or not p.name or p.name.startswith("/"):
            continue
        while True:  # the k-th node of a type in a scope: Type_k (the first: Type)
            k = numbered[scope, p.op_type]
            numbered[scope, p.op_type] += 1
            name = f"{scope}{p.op_type}" + (f"_{k}" if k else "")
            if name not in taken:
                break
        taken.add(name)
        out[p.name] = name
    return out


def _scope(p: onnx.NodeProto) -> str | None:
    """`/model/layers.0/mlp/` from the node's module paths (`_named`);
    None where the node holds none or they do not read as a list of paths."""
    text = next((m.value for m in p.metadata_props if m.key == SCOPES_KEY), None)
    if text is None:
        return None
    try:
        paths = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(paths, list) or not all(isinstance(x, str) for x in paths):
        return None
    return "/" + "".join(f"{_named(x)}/" for x in paths[:-1] if x)  # the last: the traced call


def _named(path: str) -> str:
    """A module's scope as TorchScript names it: its attribute with the indices that follow it
    (`model.layers.0` -> `layers.0`, `blocks.0.seq.1.0` -> `seq.1.0`, `blocks.0.fc` -> `fc`)."""
    parts = path.split(".")
    k = len(parts) - 1
    while k > 0 and parts[k].isdigit():
        k -= 1
    return ".".join(parts[k:])
