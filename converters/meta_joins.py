"""Values computed on the CPU beside a model built on the meta device: an image encoder's
indices and masks, from its images' sizes and places, that its code reads while its tensors
have no values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def meta_joins() -> Any:
    """A mode in which an encoder's indices and masks, computed on the CPU from the images'
    sizes and places (Qwen-VL's grid, Gemma 4's listed patches), keep their values: where an
    operator joins them with the model's meta tensors, they join on the meta device; a mask
    moved there or expanded to a meta tensor's shape stays on the CPU (code branches on its
    values: Gemma 4 skips a padding mask that masks nothing), sizes or indices moved there
    stay on the CPU in the type asked, positions asked for on the meta device (`arange`) are
    made on the CPU (GLM-4V indexes its images' sizes by them), a meta tensor moved to the CPU
    (to a kept tensor's device: SmolVLM's embeddings to its token ids') stays on the meta
    device, and the rows a CPU mask selects of a meta tensor are indexed by their places."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten, tree_map

    def on_meta(t: Any) -> Any:
        return t.to("meta") if isinstance(t, torch.Tensor) and t.device.type == "cpu" and \
            t.dim() else t

    def mask(t: Any) -> bool:  # a CPU mask, values known
        return isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dtype == torch.bool

    def known(t: Any) -> bool:  # a CPU mask, sizes or indices
        return isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_floating_point()

    def moved(to: str, *args: Any, device: Any = None, **kwargs: Any) -> bool:  # `Tensor.to`'s
        target = device or next((a for a in args if isinstance(a, (str, torch.device))), None)
        return target is not None and torch.device(target).type == to

    def untraced(f: Callable[[], Any]) -> Any:  # computed, its values the graph's constants
        set_state = torch._C._set_tracing_state  # type: ignore[attr-defined]
        state = torch._C._get_tracing_state()
        set_state(None)
        try:
            return f()
        finally:
            set_state(state)

    class MetaJoins(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func in (torch.Tensor.to, torch.as_tensor) and args and known(args[0]) and \
                    moved("meta", *args[1:], **kwargs):  # values kept: code reads them
                dtype = kwargs.get("dtype") or next(
                    (a for a in args[1:] if isinstance(a, torch.dtype)), None)
                return args[0] if dtype is None else args[0].to(dtype)  # in the type asked
            if func is torch.Tensor.to and args and getattr(args[0], "is_meta", False) and \
                    moved("cpu", *args[1:], **kwargs):  # to a kept tensor's device: stays
                return args[0]
            if func is torch.arange and moved("meta", **kwargs):  # positions: values known
                return func(*args, **{**kwargs, "device": "cpu"})
            if func is torch.Tensor.expand_as and mask(args[0]):
                return args[0].expand(args[1].shape)
            if func is torch.Tensor.__getitem__ and len(args) == 2 and mask(args[1]) and \
                    getattr(args[0], "is_meta", False):  # x[mask]: x[places]
                args = (args[0], untraced(lambda: tuple(  # constants, not NonZero's
                    i.to("meta") for i in args[1].nonzero(as_tuple=True))))
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            if any(t.is_meta for t in tensors) and any(on_meta(t) is not t for t in tensors):
                args, kwargs = tree_map(on_meta, (args, kwargs))
            return func(*args, **kwargs)

    return MetaJoins()
