"""A vision-language model from its config.json (PaliGemma, InternVL, Aya Vision, Command A
Vision, DeepSeek-VL: those transformers builds no causal LM of): built by transformers'
`AutoModelForImageTextToText` on the meta device and exported as its fine-tuning step on one
image a sample, at the size its vision config gives, and `seq_len` tokens of text around it,
of which the image's features take the first N (the placeholder tokens a processor writes);
every token's loss as labels.

Such a model encodes the images, then writes their features into the token embeddings at the
placeholder tokens: `masked_scatter` at a mask the token ids give, after checking the count of
placeholders against the features' rows: values the meta device does not have. Exported in
its place (`placed`), each sample's features take its first N positions: the same tensors read
and one copy into the embeddings, the text after them, no check. N is counted by running the
forward on the meta device up to there (`image_tokens`).

Models whose vision encoder takes a grid of patches it indexes by the grid's sizes (Qwen2-VL,
Qwen2.5-VL, GLM-4V: `image_grid_thw`), several tiles an image (LLaVA-NeXT's `image_sizes`,
Idefics3's) or splits its features into a list an image (LLaVA's) fix one image in the
graph's shapes: refused (`example_image`), export the model itself.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Iterator
from typing import Any

from converters.errors import ConversionError

AUTO = "AutoModelForImageTextToText"  # transformers' auto class of these models
# get_image_features' inputs that size an image's grid or tiles: the graph holds one image
GRID_INPUTS = ("image_grid_thw", "image_sizes", "pixel_attention_mask", "spatial_shapes")


class _Counted(Exception):
    """Ends `image_tokens`' forward once the image's features are counted."""


def image_text_model(transformers: Any, cfg: Any) -> Any:
    """transformers' auto class for `cfg` where it is a vision-language model's (an image and
    text in, text out), else None."""
    from transformers.models.auto import modeling_auto as auto

    mapping = getattr(auto, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING", {})
    return getattr(transformers, AUTO) if type(cfg) in mapping else None


def example_image(model: Any, where: str, kind: str) -> Any:
    """One sample's image [1, channels, height, width] at the size `model`'s vision config
    gives; a ConversionError where its encoder takes more than whole images (`GRID_INPUTS`)
    or its config gives no side."""
    import torch

    inner = getattr(model, "model", model)
    encode = getattr(inner, "get_image_features", None)
    takes = inspect.signature(encode).parameters if encode else {}
    grid = [p for p in GRID_INPUTS if p in takes and (  # LLaVA's optional image_sizes: none
        p != "image_sizes" or takes[p].default is inspect.Parameter.empty)]
    if encode is None or grid or _splits_per_image(inner):
        raise ConversionError(
            f"{where}: model_type {kind!r} " + (
                f"encodes an image by its {grid[0]} (its sizes fixed in the graph at one "
                "image)" if grid else "keeps each image's features apart (a list an image, "
                "fixed in the graph at one image)" if encode else
                "reads its images other than through image features in its text") +
            ": not priced from its config; export the model itself with converters.from_torch")
    vision = getattr(model.config, "vision_config", None)
    side, channels = getattr(vision, "image_size", None), getattr(vision, "num_channels", 3)
    sides = [d for d in (side if isinstance(side, (list, tuple)) else [side, side])
             if isinstance(d, int) and d > 0]
    if len(sides) != 2 or not isinstance(channels, int):
        raise ConversionError(f"{where}: model_type {kind!r} gives no vision_config."
                              "image_size: set it (the side its images train at)")
    return torch.zeros(1, channels, *sides)


def _splits_per_image(inner: Any) -> bool:
    """Whether `inner`'s get_image_features turns its features into a list an image (LLaVA's
    `list(image_features)`): the export fixes that list's length."""
    try:
        code = inspect.getsource(type(inner).get_image_features)
    except (OSError, TypeError):
        return False
    return "list(image_features)" in code


def image_tokens(model: Any, pixels: Any, where: str) -> int:
    """How many token positions one image's features take in `model` (built on the meta
    device): its forward run until they are placed."""
    import torch

    found: list[int] = []
    try:
        with placed(model, found, where), contextlib.suppress(_Counted):
            type(model).forward(model, pixel_values=pixels.to("meta"),
                                input_ids=torch.zeros(1, 1, dtype=torch.long))
    except ConversionError:
        raise
    except Exception as e:  # its code needs values: the meta device has none
        raise ConversionError(
            f"{where}: {type(model).__name__}: its images do not trace on the meta device "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200]}): export the model itself "
            "with converters.from_torch") from None
    if not found:
        raise ConversionError(f"{where}: {type(model).__name__}: its image's features never "
                              "reach its text: export the model itself with "
                              "converters.from_torch")
    return found[0]


def image_text_step(model: Any, tokens: int, seq_len: int) -> tuple[Any, tuple, list[str]]:
    """`model`'s training step on (pixel_values [B, C, H, W], input_ids [B, T]): the loss of
    every token, the image's features on the first `tokens` positions (`placed`); and where
    its forward reads token types (Gemma's: the image's tokens attend to each other, a mask
    PyTorch's attention is given), those [B, T] too, 1 the image's. The example's token
    inputs at `seq_len` and their names."""
    import torch

    forward = type(model).forward
    ids = torch.zeros(1, seq_len, dtype=torch.long)  # [1, T]
    if "token_type_ids" not in inspect.signature(forward).parameters:
        def loss(self: Any, pixel_values: Any, input_ids: Any) -> Any:
            return forward(self, pixel_values=pixel_values, input_ids=input_ids,
                           labels=input_ids).loss

        return types.MethodType(loss, model), (ids,), ["input_ids"]

    def typed(self: Any, pixel_values: Any, input_ids: Any, token_type_ids: Any) -> Any:
        return forward(self, pixel_values=pixel_values, input_ids=input_ids,
                       token_type_ids=token_type_ids, labels=input_ids).loss

    kinds = (torch.arange(seq_len) < tokens).long()[None]  # [1, T]
    return types.MethodType(typed, model), (ids, kinds), ["input_ids", "token_type_ids"]


@contextlib.contextmanager
def placed(model: Any, found: list[int] | None = None, where: str = "") -> Iterator[None]:
    """`model` (a torch vision-language model) with the image features written into each
    sample's first positions: `masked_scatter` of [B, N, d] or [B N, d] features into the
    [B, T, d] embeddings becomes a concatenation before the text's last T - N, and the
    placeholder mask it is given one of the embeddings' shape, counted from no values. With
    `found`, the forward stops there and N is appended to it. Restored after."""
    import torch

    original = torch.Tensor.masked_scatter

    def scatter(self: Any, mask: Any, source: Any) -> Any:
        if found is not None and self.dim() == 3 and source.shape[-1] != self.shape[-1]:
            raise ConversionError(f"{where}: {type(model).__name__}: its image features are "
                                  f"{source.shape[-1]:,} wide, its text's embeddings "
                                  f"{self.shape[-1]:,}: its config's projector does not fit "
                                  "its language model")
        if self.dim() != 3 or source.shape[-1] != self.shape[-1]:
            return original(self, mask, source)  # not the features into the embeddings
        features = source.reshape(self.shape[0], -1, self.shape[-1])  # [B, N, d]
        if found is not None:
            found.append(int(features.shape[1]))
            raise _Counted
        return torch.cat([features.to(self.dtype), self[:, features.shape[1]:]], dim=1)

    def mask(self: Any, input_ids: Any = None, inputs_embeds: Any = None, *args: Any,
             **kwargs: Any) -> Any:
        return torch.ones_like(inputs_embeds, dtype=torch.bool)  # what masked_scatter ignores

    holders = [m for m in model.modules() if hasattr(type(m), "get_placeholder_mask")]
    for m in holders:
        m.get_placeholder_mask = types.MethodType(mask, m)
    torch.Tensor.masked_scatter = scatter  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.masked_scatter = original  # type: ignore[method-assign]
        for m in holders:
            m.__dict__.pop("get_placeholder_mask", None)
