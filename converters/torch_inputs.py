"""What `converters.from_torch` traces: the model inside a wrapper, and the example inputs
as the exporter takes them (tensors traced as data inputs, each named; the rest bound as
given)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from converters.errors import ConversionError

DATA_PARALLEL = ("DataParallel", "DistributedDataParallel")  # wrappers of one replica's model


def unwrapped(module: Any) -> Any:
    """The model a data-parallel wrapper holds (one replica's graph: the wrapper's
    communication is the parallel plan's); a torch.compile'd module is refused, saying what
    to export instead."""
    if not callable(getattr(module, "named_parameters", None)):
        raise ConversionError(f"torch export: module is a {type(module).__name__}, not a "
                              "torch.nn.Module (wrap a function in one to export it)")
    if hasattr(module, "_orig_mod"):  # torch._dynamo's OptimizedModule
        raise ConversionError(
            f"torch export of a torch.compile'd {type(module._orig_mod).__name__}: the exporter "
            "traces eager modules; export the module it compiles, from_torch(model._orig_mod, "
            "...), and price the step as compiled (compile=True)")
    if type(module).__name__ in DATA_PARALLEL and hasattr(module, "module"):
        return unwrapped(module.module)
    return module


def example_args(module: Any, example_inputs: Any) -> tuple[tuple, list[str] | None]:
    """`example_inputs` (a tensor, a tuple, or a dict passed by keyword) as the forward's
    arguments, and the dict's keys (None for positional ones)."""
    keywords = list(example_inputs) if isinstance(example_inputs, Mapping) else None
    args = (tuple(example_inputs.values()) if keywords is not None else example_inputs
            if isinstance(example_inputs, tuple) else (example_inputs,))
    if not args:
        raise ConversionError(f"torch export of {type(module).__name__}: no example inputs")
    return args, keywords


def to_meta(args: Any) -> Any:
    """`args` with every tensor in it (through lists, tuples and dicts) on the meta device."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda a: a.to("meta") if is_array(a) else a, args)


def is_array(x: Any) -> bool:
    """A tensor or an array of any framework (what has a shape and a dtype)."""
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _walk(x: Any, name: str, found: list[tuple[str, Any]]) -> None:
    """The tensors in `x` with their names, depth first through lists, tuples and dicts
    (`input1_0`, `input0_x`)."""
    if isinstance(x, Mapping):
        for key, item in x.items():
            _walk(item, f"{name}_{key}", found)
    elif isinstance(x, (list, tuple)):
        for j, item in enumerate(x):
            _walk(item, f"{name}_{j}", found)
    elif is_array(x):
        found.append((name, x))


def _tensors(args: tuple, keywords: Sequence[str] | None) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for i, arg in enumerate(args):
        _walk(arg, keywords[i] if keywords else f"input{i}", found)
    return found


def tensors_in(x: Any) -> list[Any]:
    """The tensors in `x`, depth first through lists, tuples and dicts (a forward's output: a
    Hugging Face `ModelOutput` is a dict)."""
    found: list[tuple[str, Any]] = []
    _walk(x, "", found)
    return [t for _, t in found]


def tensor_names(args: tuple, keywords: Sequence[str] | None) -> list[str]:
    """A name for each tensor of `args`, in the order they are traced as graph inputs (depth
    first through lists, tuples and dicts: `input1_0`, `input0_x`); anything else is no
    input (None, a flag)."""
    return [name for name, _ in _tensors(args, keywords)]


def _rebuilt(x: Any, values: Any) -> Any:
    """`x` with each of its tensors replaced by the next of `values` (`_walk`'s order)."""
    kind: Any = type(x)
    if isinstance(x, Mapping):
        mapping = {key: _rebuilt(item, values) for key, item in x.items()}
        try:
            return kind(mapping)  # a tokenizer's BatchEncoding, an OrderedDict
        except Exception:  # noqa: BLE001 (a mapping type built otherwise): a plain dict
            return mapping
    if isinstance(x, (list, tuple)):
        items = [_rebuilt(item, values) for item in x]
        return kind(*items) if hasattr(x, "_fields") else kind(items)  # a namedtuple's fields
    return next(values) if is_array(x) else x


def data_input_names(args: tuple, keywords: Sequence[str] | None,
                     given: Sequence[str] | None) -> list[str]:
    """The data inputs' names: `given`, one per input tensor, else `tensor_names`."""
    names = tensor_names(args, keywords)
    if given is not None and len(given) != len(names):
        raise ConversionError(f"input_names: {len(given)} names for the {len(names)} input "
                              f"tensors ({', '.join(names)})")
    return list(given) if given is not None else names


def _seq_first(_m: Any, args: tuple, kw: dict) -> tuple[int, bool] | None:
    """A `batch_first=False` module's input [S, B, E]: its batch, at dim 1 (2-D: unbatched)."""
    t = next((x for x in (*args, *kw.values()) if is_array(x)), None)
    return (int(t.shape[1]), True) if t is not None and len(t.shape) == 3 else None


def _bags(m: Any, args: tuple, kw: dict) -> tuple[int, bool] | None:
    """`nn.EmbeddingBag`'s bags are the samples: its offsets' count (less the last offset
    where given), or the rows of a 2-D input."""
    x = args[0] if args else kw.get("input")
    offsets = args[1] if len(args) > 1 else kw.get("offsets")
    if offsets is not None:
        return int(offsets.shape[0]) - int(m.include_last_offset), False
    return (int(x.shape[0]), False) if x is not None and len(x.shape) == 2 else None


# modules that know the batch they read: (which, the batch and whether it is at dim 1)
BATCH_READERS = ((lambda m: getattr(m, "batch_first", None) is False, _seq_first),
                 (lambda m: type(m).__name__ == "EmbeddingBag", _bags))


def _hooked_forward(module: Any, args: tuple, keywords: Sequence[str] | None,
                    hooks: list[tuple[Any, Any]]) -> bool:
    """Whether one forward ran, in eval mode (no running statistics move) without gradients,
    with each (module, pre-hook taking keywords) of `hooks` registered for it (a forward that
    fails is the export's to say)."""
    import torch

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m, hook in hooks]
    was = module.training
    try:
        module.eval()
        with torch.no_grad():
            module(**dict(zip(keywords, args))) if keywords else module(*args)
        return True
    except Exception:  # noqa: BLE001
        return False
    finally:
        module.train(was)
        for h in handles:
            h.remove()


def probe(module: Any, args: tuple, keywords: Sequence[str] | None,
          names: Sequence[str]) -> tuple[int | None, frozenset[int]]:
    """The batch the model's modules read, where one says (`BATCH_READERS`: PyTorch's
    recurrent and attention modules at their default `batch_first=False` read [sequence,
    batch, ...], as its tutorial's language model takes [35, 20] ids; `nn.EmbeddingBag`'s bags),
    from one forward, hooked; and the data tensors (indices in `_walk`'s order) whose batch is
    dim 1 (an input of rank >= 2 with that batch there). Such an input with the same size at
    dim 0 says nothing of which is which: refused. (None, none) where no module says."""

    readers = [(m, read) for m in module.modules() for which, read in BATCH_READERS if which(m)]
    if not readers:
        return None, frozenset()
    seen: set[tuple[int, bool]] = set()

    def hooked(read):
        def hook(m, a, kw):
            if (got := read(m, a, kw)) is not None:
                seen.add(got)
        return hook

    if not _hooked_forward(module, args, keywords, [(m, hooked(read)) for m, read in readers]) \
            or len({b for b, _ in seen}) != 1:
        return None, frozenset()
    batch = next(iter(seen))[0]
    if not any(dim1 for _, dim1 in seen):
        return batch, frozenset()
    found = set()
    for i, (name, t) in enumerate(zip(names, (t for _, t in _tensors(args, keywords)))):
        if len(t.shape) >= 2 and t.shape[1] == batch:
            if t.shape[0] == batch:
                first = next(type(m).__name__ for m, read in readers if read is _seq_first)
                raise ConversionError(
                    f"input '{name}' {list(t.shape)}: the model's {first} (batch_first=False) "
                    f"reads a batch of {batch} at dim 1, as large as dim 0; give example "
                    "inputs whose batch differs from their sequence length")
            found.add(i)
    return batch, frozenset(found)


def batch_first(args: tuple, keywords: Sequence[str] | None, which: frozenset[int]) -> tuple:
    """`args` with the tensors `which` (`probe`'s) transposed to [batch, sequence, ...]."""
    flat = [t.transpose(0, 1).contiguous() if i in which else t
            for i, (_, t) in enumerate(_tensors(args, keywords))]
    return tuple(_rebuilt(list(args), iter(flat)))


@contextlib.contextmanager
def positional_forward(module: Any, args: tuple, keywords: Sequence[str] | None = None,
                       transposed: frozenset[int] = frozenset()):
    """`module.forward` as a function of the given inputs alone while exporting; yields what
    to trace: the tensors, taken out of any list, tuple or dict holding them (a `batch` dict
    as one argument) and put back for the forward. The rest (None, a flag) is bound as given,
    and a dict of `example_inputs` is passed by the names in `keywords`. The exporter binds
    every other parameter of the forward that has a default as one more traced input: an int
    default becomes a tensor, and code that branches on `isinstance(x, int)` takes the other
    branch (a Hugging Face causal LM's `logits_to_keep=0`, which keeps every position, became
    a scalar index: the logits of one position per sequence); a flag given as an argument
    would too. The tensors `transposed` (`batch_first`) are transposed back for the forward:
    the graph takes them batch first."""
    had = module.__dict__.get("forward")
    forward = module.forward

    def call(*values):
        values = tuple(v.transpose(0, 1) if i in transposed else v for i, v in enumerate(values))
        full = _rebuilt(list(args), iter(values))
        return forward(**dict(zip(keywords, full))) if keywords else forward(*full)

    module.forward = call
    try:
        yield tuple(t for _, t in _tensors(args, keywords))
    finally:
        if had is None:
            del module.forward
        else:
            module.forward = had


def listed(module: Any, args: tuple, keywords: Sequence[str] | None,
           names: Sequence[str]) -> dict | None:
    """A batch given as a list of samples, each its own tensor (torchvision's detection
    models take their images so, each [C, H, W], and stack them): {"size": the list's length,
    "inputs": its tensors' names}, where the first module without children that reads a
    tensor reads one a dim longer than the list's tensors with the list's length at dim 0
    (from one forward, hooked): a list of inputs each [B, ...] (feature maps, a pair) is
    read as it is. None where no argument is a list of tensors."""
    lists = [a for a in args if isinstance(a, list) and a and all(map(is_array, a))]
    if not lists:
        return None
    read: list[tuple[int, int]] = []  # (dim 0, rank) of the first tensor read

    def hook(_m, a, kw):
        t = next((x for x in (*a, *kw.values()) if is_array(x) and len(x.shape)), None)
        if t is not None and not read:
            read.append((int(t.shape[0]), len(t.shape)))

    if not _hooked_forward(module, args, keywords, [
            (m, hook) for m in module.modules() if not next(m.children(), None)]):
        return None
    flat = [t for _, t in _tensors(args, keywords)]
    samples = next((a for a in lists if read == [(len(a), len(a[0].shape) + 1)]), None)
    return None if samples is None else {"size": len(samples), "inputs": [
        names[i] for i, t in enumerate(flat) if any(t is x for x in samples)]}


def batch_axes(args: tuple, keywords: Sequence[str] | None, names: Sequence[str],
               batch: int | None = None, listed: bool = False) -> dict[str, dict[int, str]]:
    """Dim 0 of each data input (`names`, one per tensor of `args`) as exported: `batch` where
    it is the batch (`batch`, where the model's modules say it (`probe`), else
    `dims.batch_of`); `batch*R` for a flat integer input R times as long (`nn.EmbeddingBag`'s
    ids of every bag beside their offsets; their weights too where a module said the batch),
    which keeps its length to the batch at any batch; `fixed:N` for any other (Flux's position
    ids), which keeps its N (`dims.scaled`). A graph network's edges (`edge_index` [2, E]:
    integers indexing the batch's nodes) keep their count to the nodes: dim 1 `batch*E/N`.
    A batch `listed` as samples is no input's dim: every dim 0 is `fixed:N`."""
    from converters.dims import BATCH, FIXED, batch_of

    tensors = [t for _, t in _tensors(args, keywords)]
    sizes = [int(t.shape[0]) if len(t.shape) else 0 for t in tensors]
    integer = {n for n, t in zip(names, tensors) if "int" in str(t.dtype)}  # any array's dtype
    said = batch is not None
    batch = batch or batch_of({n: [s] for n, s in zip(names, sizes)}, integer)

    def symbol(n: str, t: Any, s: int) -> str:
        if listed:
            return f"{FIXED}{s}"
        if s == batch:
            return BATCH
        flat = len(t.shape) == 1 and (n in integer or said)  # ids; weights beside bags' ids
        return f"{BATCH}*{s / batch:g}" if flat and s > batch else f"{FIXED}{s}"

    def edges(n: str, t: Any) -> bool:  # a graph network's edge_index [2, E] into the batch's
        return (n in integer and len(t.shape) == 2 and t.shape[0] == 2 != batch  # nodes
                and t.device.type != "meta" and t.numel() > 0
                and 0 <= int(t.min()) and int(t.max()) < batch)

    return {n: {0: f"{FIXED}2", 1: f"{BATCH}*{t.shape[1] / batch:g}"} if edges(n, t)
            else {0: symbol(n, t, s)} for n, t, s in zip(names, tensors, sizes) if s}
