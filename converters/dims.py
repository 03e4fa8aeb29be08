"""The data inputs' dims: checked, made concrete from the flags that set them, and named in
the errors a graph exported at other dims gives."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from converters.errors import ConversionError
from converters.sequence import (
    BATCH_KEY,
    HEAD_KEY,
    LISTED_KEY,
    OperatorSequence,
    data_input_names,
)
from converters.tensors import TOKEN_TYPES

MAX_DIM = 2 ** 31 - 1
# the longest data input (a sequence's tokens) converted: shape inference holds each position
# of its arithmetic (about 1 KB each; an input of 10**8 ran a 24 GB machine out of memory)
MAX_LENGTH = 2 ** 22
MAX_BATCH_TOKENS = 2 ** 25  # a token input's elements (batch x length): about 150 bytes each
BATCH = "batch"  # dim 0's symbol in our exports (`torch_inputs.batch_axes`)
FIXED = "fixed:"  # an input's dim 0 that is not the batch: its size follows


def check_dims(**dims: Any) -> None:
    """Each of `dims` (batch_size=..., seq_len=...) is None or a positive int: a ConversionError
    names the first that is not (a string, a float, a bool, NaN, zero, negative, huge)."""
    for name, v in dims.items():
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 < v <= MAX_DIM:
            raise ConversionError(f"{name} {v!r}: expected a positive integer")


def batch_of(inputs: Mapping[str, Sequence[int]], integer: Collection[str] = (),
             marked: Sequence[str] = ()) -> int:
    """The batch of data inputs (name -> shape): dim 0 of the first input `marked` as the
    batch (exported with the symbol `batch`, as `concretise` records); else the dim 0 most of
    them share, on a tie a float input's (the data computed on) before an `integer` one's
    (indices: a graph's edges [2, E]), then the smaller (every bag's ids are longer than their
    offsets); 1 where none has a dim."""
    shapes = {n: s for n, s in inputs.items() if len(s) and s[0]}
    if first := next((n for n in marked if n in shapes), None):
        return int(shapes[first][0])
    counts = Counter(int(s[0]) for s in shapes.values())
    floats = {int(s[0]) for n, s in shapes.items() if n not in integer}
    return min(counts, key=lambda d: (-counts[d], d not in floats, d)) if counts else 1


def converted_batch(seq: OperatorSequence) -> int:
    """The batch a sequence was converted at (`batch_of` of its data inputs; a list's
    length where its samples came as one)."""
    m = seq.meta
    if isinstance(listed := m.get("listed"), dict) and isinstance(listed.get("size"), int):
        return listed["size"]
    return batch_of(m.get("inputs", {}), m.get("integer_inputs", ()), m.get("batch_inputs", ()))


def scaled(symbol: str, batch: int) -> int:
    """Dim 0 of a data input exported as `symbol` at `batch` (`torch_inputs.batch_axes`):
    `batch*R` (R times as long as the batch) is R times it, at least 1; `fixed:N` is N; any
    other, the batch."""
    size = symbol[len(FIXED):] if symbol.startswith(FIXED) else ""
    if size.isdigit() and int(size) > 0:
        return int(size)
    ratio = symbol[len(BATCH) + 1:] if symbol.startswith(BATCH + "*") else ""
    try:
        r = float(ratio) if ratio else 1.0
    except ValueError:
        r = 1.0
    return max(1, round(batch * r)) if math.isfinite(r) and r > 0 else batch


def _dim_hint(name: str, shape: list[int], k: int, t, symbol: str) -> str:
    """The flag that sets symbolic dim `k` (named `symbol`) of data input `name` (-1 marks
    symbolic dims)."""
    if symbol.startswith(BATCH + "*"):
        return f"--batch-size N (its dim {k} is {symbol[len(BATCH) + 1:]} times the batch)"
    if k == 0:
        example = ",".join(str(d if d >= 0 else 1) for d in shape)
        return f"--input-shape {name}={example} (or --batch-size N for dim 0)"
    if len(shape) == 4:
        return "--image-size N (the image side in pixels)"
    if len(shape) == 2 and t.elem_type in TOKEN_TYPES:
        return "--seq-len N (tokens per sequence)"
    example = ",".join(str(d) if d >= 0 else f"D{i}" for i, d in enumerate(shape))
    return f"--input-shape {name}={example} with every dim given"


def _sides(shape: Sequence[int]) -> tuple[int, int]:
    """The two spatial dims of an image input's shape: NHWC when its last dim holds 1 or 3
    channels and its second does not, else NCHW."""
    return (1, 2) if shape[3] in (1, 3) and shape[1] not in (1, 3) else (2, 3)


def drop_metadata(model: onnx.ModelProto, key: str) -> None:
    """`model` without its metadata `key`, in place."""
    kept = [p for p in model.metadata_props if p.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)


def head_of(model: onnx.ModelProto) -> dict:
    """What a config's graph says of what it trains (`converters.hf_config`), or {}."""
    said = next((p.value for p in model.metadata_props if p.key == HEAD_KEY), "")
    return json.loads(said) if said else {}


def _listed_batch(said: str, batch_size: int, label: str) -> None:
    """Refuses a batch other than the list of samples `said` (`LISTED_KEY`) the graph holds."""
    try:
        listed = json.loads(said)
        size, inputs = int(listed["size"]), [str(n) for n in listed["inputs"]]
    except (ValueError, TypeError, KeyError):
        raise ConversionError(f"{label}: metadata {LISTED_KEY!r} is not a list's size and "
                              f"inputs: {said!r:.40}") from None
    if size != batch_size:
        raise ConversionError(
            f"{label}: its batch is a list of {size} samples ({', '.join(inputs[:3])}"
            f"{', ...' if len(inputs) > 3 else ''}), each its own input: the graph holds "
            f"{size}; export a list of {batch_size} to predict --batch-size {batch_size}")


def concretise(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]],
                batch_size: int | None, image_size: int | None, seq_len: int | None,
                label: str) -> dict[str, dict[int, int]]:
    """Sets the data inputs' dims; returns the fixed dims of data inputs this changed, as
    exported (name -> dim -> size)."""
    data = data_input_names(model)
    listed = next((p.value for p in model.metadata_props if p.key == LISTED_KEY), None)
    if listed is not None and batch_size is not None:
        _listed_batch(listed, batch_size, label)
    marked = [vi.name for vi in model.graph.input if vi.name in data and
              vi.type.tensor_type.shape.dim and
              vi.type.tensor_type.shape.dim[0].dim_param == BATCH]
    if marked:  # what the batch is, once the dims are numbers
        drop_metadata(model, BATCH_KEY)
        model.metadata_props.add(key=BATCH_KEY, value=json.dumps(marked))
    changed: dict[str, dict[int, int]] = {}
    sized = {"image": False, "tokens": False}  # whether --image-size / --seq-len applied
    unknown = set(input_shapes) - set(data)
    if unknown:
        raise ConversionError(f"{label}: --input-shape names unknown input(s) "
                              f"{sorted(unknown)}; the model's inputs are {data}")
    for vi in model.graph.input:
        t = vi.type.tensor_type
        dims = t.shape.dim
        if vi.name in input_shapes:
            shape = [int(d) for d in input_shapes[vi.name]]
            if len(shape) != len(dims):
                raise ConversionError(f"{label}: input '{vi.name}' has rank {len(dims)} but "
                                      f"--input-shape gives {len(shape)} dims {shape}")
            if batch_size is not None and shape and shape[0] != batch_size and \
                    not dims[0].dim_param.startswith((BATCH + "*", FIXED)):  # the batch
                raise ConversionError(f"{label}: input '{vi.name}': --input-shape gives batch "
                                      f"{shape[0]} but --batch-size is {batch_size}; give one")
            tokens = len(shape) == 2 and t.elem_type in TOKEN_TYPES
            sides = [shape[k] for k in _sides(shape)] if len(shape) == 4 else []
            for flag, size, given in (("--image-size", image_size, sides),
                                      ("--seq-len", seq_len, shape[1:] if tokens else [])):
                if size is not None and any(d != size for d in given):
                    raise ConversionError(f"{label}: input '{vi.name}': --input-shape gives "
                                          f"{'x'.join(map(str, given))} but {flag} is {size}; "
                                          "give one")
            sized["image"] |= len(shape) == 4  # its size given in full instead
            sized["tokens"] |= tokens
        else:
            shape = [d.dim_value if d.HasField("dim_value") else -1 for d in dims]
            names = [d.dim_param or "?" for d in dims]
            if vi.name in data:
                was = list(shape)
                if shape and (batch_size is not None or names[0].startswith(FIXED)):
                    shape[0] = scaled(names[0], batch_size or 1)
                for k in range(1, len(shape)):
                    if batch_size is not None and names[k].startswith(BATCH + "*"):
                        shape[k] = scaled(names[k], batch_size)  # a graph's edges: its nodes
                if image_size is not None and len(shape) == 4:
                    for k in _sides(shape):
                        shape[k] = image_size
                    sized["image"] = True
                if seq_len is not None and len(shape) == 2 and t.elem_type in TOKEN_TYPES \
                        and not names[1].startswith(BATCH + "*"):
                    shape[1] = seq_len
                    sized["tokens"] = True
                if moved := {k: d for k, d in enumerate(was) if 0 < d != shape[k]}:
                    changed[vi.name] = moved
            missing = [k for k, d in enumerate(shape) if d < 0]
            if missing:
                k = missing[0]
                raise ConversionError(f"{label}: input '{vi.name}' dim {k} ('{names[k]}') is "
                                      f"symbolic; pass {_dim_hint(vi.name, shape, k, t, names[k])}")
        if any(d <= 0 for d in shape):
            raise ConversionError(f"{label}: input '{vi.name}' shape {shape} has a "
                                  "non-positive dim")
        if vi.name in data and (long := [k for k, d in enumerate(shape) if k and d > MAX_LENGTH]):
            raise ConversionError(f"{label}: input '{vi.name}' dim {long[0]} is "
                                  f"{shape[long[0]]:,}: at most {MAX_LENGTH:,} (the conversion "
                                  "holds each position)")
        held = math.prod(shape) if t.elem_type in TOKEN_TYPES else 0  # token ids
        if vi.name in data and held > MAX_BATCH_TOKENS:
            raise ConversionError(f"{label}: input '{vi.name}' shape {shape}: {held:,} tokens "
                                  f"a micro-batch, more than {MAX_BATCH_TOKENS:,} (the "
                                  "conversion holds each)")
        del dims[:]
        for d in shape:
            t.shape.dim.add().dim_value = d
    for flag, value, kind, what in (("--image-size", image_size, "image", "no image input "
                                     "(a rank-4 data input)"),
                                    ("--seq-len", seq_len, "tokens", "no token-id input (a "
                                     "rank-2 integer data input)")):
        if value is not None and not sized[kind]:
            raise ConversionError(f"{label}: {flag} {value} does not apply: the model has "
                                  f"{what}; its data inputs are {data}")
    return changed


def baked(label: str, changed: Mapping[str, Mapping[int, int]], model: onnx.ModelProto) -> str:
    """The error of a graph whose shapes depend on the `changed` dims of its inputs, as
    exported: those dims, the flags that predict at them, the export that frees them."""
    ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in model.graph.input}
    flags, dims = {}, []
    for name, moved in changed.items():
        for k, d in moved.items():
            dims.append(f"input '{name}' dim {k} = {d}")
            flag = "--batch-size" if k == 0 else "--image-size" if ranks[name] == 4 else \
                "--seq-len"
            flags[flag] = d
    return (f"{label}: a shape in the graph depends on the size it was exported at "
            f"({', '.join(dims)}); predict at {' '.join(f'{f} {d}' for f, d in flags.items())}"
            f", or export again with {'those dims' if len(dims) > 1 else 'that dim'} dynamic "
            "(torch.onnx.export(..., dynamic_shapes=...), or dynamic_axes= without dynamo)")
