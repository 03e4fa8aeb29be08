"""Sizes that the data decides: boolean-mask indexing (`logits[labels != -100]`, BART's
end-of-sentence tokens `hidden[eos_mask]`), `torch.nonzero`, `torch.where(cond)`,
`masked_select`. Each exports as an ONNX NonZero, whose count no shape gives. `from_torch`
runs the forward once more on the example, recording each selection's share of its mask's
elements (`SELECTED_KEY`, in graph order); `sized` gives each NonZero that share of its input
at the shapes asked, so the selection grows with the batch and the sequence as the example's
did."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from converters.errors import ConversionError

SELECTED_KEY = "mdot.selected"  # model metadata: each NonZero's share of its input (graph order)


def recorded(torch: Any, run: Any) -> list[float]:
    """Each selection's share of its mask's elements while `run()` runs, in the order run."""
    from torch.utils._python_dispatch import TorchDispatchMode

    shares: list[float] = []

    class Selections(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in ("nonzero", "masked_select"):
                mask = args[0] if name == "nonzero" else args[1]
                count = out.shape[0] if name == "nonzero" else out.numel()
                shares.append(count / max(torch.broadcast_shapes(
                    args[0].shape, mask.shape).numel() if name == "masked_select"
                    else mask.numel(), 1))
            elif name in ("index", "_unsafe_index"):
                shares.extend(float(i.sum()) / max(i.numel(), 1) for i in args[1]
                              if i is not None and i.dtype in (torch.bool, torch.uint8))
            return out

    with Selections():
        run()
    return shares


def sized(model: onnx.ModelProto, shapes: dict[str, list[int]], label: str) -> bool:
    """Gives each NonZero whose input's shape is known and whose count is not its recorded
    share of the input's elements (`value_info`). Returns whether any was given."""
    said = next((p.value for p in model.metadata_props if p.key == SELECTED_KEY), None)
    nodes = [n for n in model.graph.node if n.op_type == "NonZero"]
    if said is None or not nodes:
        return False
    try:
        shares = [float(s) for s in said.split(",")]
    except ValueError:
        raise ConversionError(f"{label}: metadata {SELECTED_KEY!r} is not a list of "
                              f"fractions: {said!r:.40}") from None
    if len(shares) != len(nodes) or not all(0 <= s <= 1 for s in shares):
        return False  # not what this graph selects: its NonZeros stay unsized
    given = False
    for node, share in zip(nodes, shares):
        have = shapes.get(node.input[0])
        if have is None or node.output[0] in shapes:
            continue
        n = 1
        for d in have:
            n *= d
        count = max(round(share * n), 1) if share > 0 else 0
        model.graph.value_info.append(helper.make_tensor_value_info(
            node.output[0], onnx.TensorProto.INT64, [max(len(have), 1), count]))
        given = True
    return given
