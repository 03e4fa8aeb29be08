"""What `from_torch` records of the sizes the data decides (`converters.selected`): the
forward run once more on the example (`on_example`), each selection's share of its mask's
elements and each non-maximum suppression's of its boxes, matched to the exported graph's
nodes (`shares`)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import warnings
from typing import Any
from unittest import mock

import onnx

from converters.errors import ConversionError
from converters.loader import concrete_shapes, load_model, shaped
from converters.patches import patched
from converters.selected import SELECTING, SUPPRESSED_KEY
from converters.sequence import SELECTED_KEY
from converters.substitutes import substituted

FILLS = ("index_put", "index_put_", "_index_put_impl_")  # PyTorch's `x[mask] = value`
INDEXING = ("index", "_unsafe_index", *FILLS)  # its `x[mask]`, then those


def recorded(torch: Any, run: Any) -> list[tuple[float, int, str]]:
    """(share of its mask's elements, the elements its NonZero reads, "NonZero") of each
    selection while `run()` runs, in the order run; (share of the boxes kept, the boxes,
    "NonMaxSuppression") of each of torchvision's `nms` (a detector's proposals)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    out: list[tuple[float, int, str]] = []

    def selects(mask: Any, read: int) -> None:
        out.append((float((mask != 0).sum()) / max(mask.numel(), 1), read, "NonZero"))

    class Selections(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            masks = [i for i in (args[1] if name in INDEXING else ())
                     if i is not None and i.dtype in (torch.bool, torch.uint8)]
            if name == "nms":
                kept = func(*args, **(kwargs or {}))
                out.append((len(kept) / max(len(args[0]), 1), len(args[0]), SELECTING[1]))
                return kept
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


def on_example(torch: Any, module: Any, given: tuple, keywords: list[str] | None,
               drawn: Any = None) -> list[tuple[float, int, str]]:
    """`recorded` of the module's forward on the example, as exported (its patches and
    substitutes; torchvision's batched non-maximum suppression as it runs while traced: once
    over every level, not once a level), from the random state `drawn` the trace drew from
    (a detector's random image size in training, its samplers); none where it does not run
    again."""
    def run() -> None:
        module(*given) if keywords is None else module(**dict(zip(keywords, given)))

    trick = getattr(sys.modules.get("torchvision.ops.boxes"), "_batched_nms_coordinate_trick",
                    None)
    try:
        with warnings.catch_warnings(), torch.no_grad(), patched(torch), substituted(module), \
                contextlib.ExitStack() as stack:
            if drawn is not None:  # (the caller's random state restored after)
                stack.enter_context(torch.random.fork_rng(devices=[]))
                torch.random.set_rng_state(drawn)
            if trick is not None:  # as while traced
                stack.enter_context(mock.patch(
                    "torchvision.ops.boxes._batched_nms_vanilla", trick))
            warnings.simplefilter("ignore")
            return recorded(torch, run)
    except Exception:  # its NonZeros stay unsized: the converter says where
        return []


def _selecting(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> list[tuple[Any, Any]]:
    """Each NonZero and NonMaxSuppression of `model`'s graph, in order, with what it reads:
    its input's elements, the boxes of each batch and class (ONNX's scores [B, C, N]); None
    where that shape is unknown."""
    out = []
    for node in model.graph.node:
        if node.op_type in SELECTING:
            have = shapes.get(node.input[0 if node.op_type == "NonZero" else 1])
            out.append((node, None if have is None else math.prod(have)))
    return out


Shares = tuple[list[float], dict[str, float]]  # the NonZeros' in order; NMS's by node name


def shares(model: onnx.ModelProto, selected: list[tuple[float, int, str]],
           batch: int | None) -> Shares | None:
    """Each NonZero's share of its input (graph order) and each NonMaxSuppression's of its
    boxes (by node name: a branch that holds one is inlined once taken), from the example's
    selections (`recorded`, in the order run). Which selection a node is cannot always be
    told (the exporter merges some, writes others as masked fills): nodes reading as many
    elements take the mean of those selections, so that they add up as the example's did (a
    mixture's experts: balanced). Where that leaves one unsized (a chain of selections, each
    from what the one before kept, whose means compound: a detector's proposals), each takes
    the first selection of its kind after its predecessor's that read as many (the trace
    keeps the order run; a detector's at once). A selection from what another selected is
    sized once that one is. None where a node's size was selected from by none."""
    modes = (True,) if any(kind != "NonZero" for *_, kind in selected) else (False, True)
    return next(filter(None, (_shares(model, selected, batch, m) for m in modes)), None)


def _shares(model: onnx.ModelProto, selected: list[tuple[float, int, str]],
            batch: int | None, in_order: bool) -> Shares | None:
    by_size: dict[tuple[int, str], list[float]] = {}
    for fraction, size, kind in selected:
        by_size.setdefault((size, kind), []).append(fraction)
    nonzeros = [n.name for n in model.graph.node if n.op_type == "NonZero"]
    found: dict[str, float] = {}  # each node's share, by name (the export names them all)
    matched: dict[str, int] = {}  # in order: each node's selection
    suppressions: set[str] = set()
    loaded = onnx.ModelProto()
    loaded.CopyFrom(model)
    said = loaded.metadata_props.add(key=SELECTED_KEY)
    suppressed = loaded.metadata_props.add(key=SUPPRESSED_KEY)
    first = True
    while True:  # a selection from what another selected: sized once that one is
        out = [found.get(n, math.nan) for n in nonzeros]  # NaN: not yet known
        kept = {n: found[n] for n in suppressions}
        said.value, suppressed.value = json.dumps(out), json.dumps(kept)
        try:  # the graph as shaped so far, shaped on
            loaded = load_model(loaded, batch_size=batch) if first else shaped(loaded, "")
        except ConversionError:
            return None
        said, suppressed = (next(p for p in loaded.metadata_props if p.key == key)
                            for key in (SELECTED_KEY, SUPPRESSED_KEY))
        first, after, given = False, 0, False
        for node, size in _selecting(loaded, concrete_shapes(loaded.graph)):
            if node.name in found:
                after = max(after, matched.get(node.name, -1) + 1)
                continue
            if size is None:
                if in_order:  # its predecessors first
                    break
                continue
            if not in_order:
                if (seen := by_size.get((size, node.op_type))) is None:
                    continue
                found[node.name] = sum(seen) / len(seen)
            else:
                j = next((j for j in range(after, len(selected))
                          if selected[j][1:] == (size, node.op_type)), None)
                if j is None:
                    return None
                found[node.name], matched[node.name], after = selected[j][0], j, j + 1
            if node.op_type != "NonZero":
                suppressions.add(node.name)
            given = True
        if not given:  # (a selection of constants alone is folded away: D-FINE's denoising
            left = {n.name for n in loaded.graph.node if n.op_type == "NonZero"}  # groups')
            return None if any(math.isnan(v) for n, v in zip(nonzeros, out) if n in left) \
                else (out, kept)
