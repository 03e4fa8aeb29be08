"""Sizes that the data decides: boolean-mask indexing (`logits[labels != -100]`, BART's
end-of-sentence tokens `hidden[eos_mask]`), `torch.nonzero`, `torch.where(cond)`,
`masked_select`. Each exports as an ONNX NonZero, whose count no shape gives. `from_torch`
runs the forward once more on the example (`on_example`), recording each selection's share of
its mask's elements; each NonZero takes the mean share of the selections from masks of its
size (`SELECTED_KEY`, in graph order), and `sized` gives it that share of its input at the
shapes asked, so the selection grows with the batch and the sequence as the example's did."""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import onnx
from onnx import helper

from converters.errors import ConversionError
from converters.patches import patched
from converters.sequence import SELECTED_KEY
from converters.substitutes import substituted

FILLS = ("index_put", "index_put_", "_index_put_impl_")  # PyTorch's `x[mask] = value`
INDEXING = ("index", "_unsafe_index", *FILLS)  # its `x[mask]`, then those


def recorded(torch: Any, run: Any) -> list[tuple[float, int]]:
    """(share of its mask's elements, the elements its NonZero reads) of each selection while
    `run()` runs, in the order run."""
    from torch.utils._python_dispatch import TorchDispatchMode

    out: list[tuple[float, int]] = []

    def selects(mask: Any, read: int) -> None:
        out.append((float((mask != 0).sum()) / max(mask.numel(), 1), read))

    class Selections(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            masks = [i for i in (args[1] if name in INDEXING else ())
                     if i is not None and i.dtype in (torch.bool, torch.uint8)]
            if name == "nonzero":
                selects(args[0], args[0].numel())
            elif name == "masked_select":  # the mask as broadcast to the input
                selects(args[1], torch.broadcast_shapes(args[0].shape, args[1].shape).numel())
            elif masks and not (name in FILLS and len(args[1]) == 1 and args[2].numel() == 1):
                for mask in masks:  # a scalar set through one mask: a masked fill, no NonZero
                    selects(mask, mask.numel())
            return func(*args, **(kwargs or {}))

    with Selections():
        run()
    return out


def on_example(torch: Any, module: Any, given: tuple,
               keywords: list[str] | None) -> list[tuple[float, int]]:
    """`recorded` of the module's forward on the example, as exported (its patches and
    substitutes); none where it does not run again."""
    def run() -> None:
        module(*given) if keywords is None else module(**dict(zip(keywords, given)))

    try:
        with warnings.catch_warnings(), torch.no_grad(), patched(torch), substituted(module):
            warnings.simplefilter("ignore")
            return recorded(torch, run)
    except Exception:  # its NonZeros stay unsized: the converter says where
        return []


def reads(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> list[int | None]:
    """The elements each NonZero of `model` reads (None where its input's shape is unknown)."""
    out: list[int | None] = []
    for node in model.graph.node:
        if node.op_type == "NonZero":
            have = shapes.get(node.input[0])
            out.append(None if have is None else math.prod(have))
    return out


def sized(model: onnx.ModelProto, shapes: dict[str, list[int]], label: str) -> bool:
    """Gives each NonZero whose input's shape is known and whose count is not yet its recorded
    share of the input's elements (a `value_info`; a share of nan: none). Returns whether any
    was given."""
    said = next((p.value for p in model.metadata_props if p.key == SELECTED_KEY), None)
    nodes = [n for n in model.graph.node if n.op_type == "NonZero"]
    if said is None or not nodes:
        return False
    try:
        shares = json.loads(said)
    except ValueError:
        shares = None
    if not isinstance(shares, list) or not all(isinstance(s, (int, float)) for s in shares):
        raise ConversionError(f"{label}: metadata {SELECTED_KEY!r} is not a list of "
                              f"fractions: {said!r:.40}")
    if len(shares) != len(nodes) or not all(0 <= s <= 1 or math.isnan(s) for s in shares):
        return False  # not what this graph selects: its NonZeros stay unsized
    given = False
    for node, share in zip(nodes, shares):
        have = shapes.get(node.input[0])
        if have is None or node.output[0] in shapes or math.isnan(share):  # nan: not known
            continue
        n = math.prod(have)
        count = max(round(share * n), 1) if share > 0 else 0
        model.graph.value_info.append(helper.make_tensor_value_info(
            node.output[0], onnx.TensorProto.INT64, [max(len(have), 1), count]))
        given = True
    return given
