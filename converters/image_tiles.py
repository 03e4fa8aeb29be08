"""An image-text model's images as a training example gives them (`Images`), and the
encoders that take an image as tiles: LLaVA-NeXT's and LLaVA-OneVision's grid of tiles beside
the whole resized (`any_resolution`, transformers' `unpad_image` as `unpadded`), Idefics3's
and SmolVLM's tiles of an image resized to a side (`split_image`, their padding tiles' search
by value left out: `every_tile`), LFM2-VL's lists of patches as its image processor makes them
(`processed`), Llama 3.2 Vision's tiles padded to its most (`cross_tiles`)."""

from __future__ import annotations

import inspect
import sys
from typing import Any, NamedTuple

from converters.errors import ConversionError

GRID = "image_grid_thw"  # get_image_features' input of a grid encoder: each image's [t, h, w]
LISTS = "spatial_shapes"  # a patch-list encoder's (Siglip2's, LFM2-VL's): each tile's [h, w]


class Images(NamedTuple):
    """One image (or video) a sample, as the example gives them: `pixels` [B, C, H, W] (a grid
    encoder's: its patches [B, P, C t p p]), the encoder's `fixed` inputs (a grid's sizes
    [B n, 3], n a video's patches over time, values on the CPU) and the image's `size` [H, W]."""

    pixels: Any
    fixed: dict
    size: list[int]
    held: bool = False  # the graph holds the example's images: it converts at that batch alone
    tiles: int = 0  # tiles an image is cut into (LLaVA-NeXT's, Llama 3.2 Vision's); 0: none
    cross: bool = False  # its text reads them by cross-attention (Llama 3.2 Vision's)
    frames: int = 0  # a video's frames (a grid encoder's over time); 0: an image
    tile: int = 0  # a tile's side where the pixels do not say it (patch lists); 0: they do
    key: str = "pixel_values"  # the forward's input they are (an audio model's features)
    chunks: int = 0  # an audio's chunks a sample ([B, chunks, ...], flattened for the encoder)

    @property
    def noun(self) -> str:
        """What they are in words: an image, or an audio-language model's audio."""
        return "image" if self.key == "pixel_values" else "audio"

    def said(self, images: int) -> dict:
        """What the prediction says of them beyond their size: the images a sample the graph
        holds, a grid encoder's loop (Qwen-VL's), the tiles and their side, cross-attention,
        a video's frames."""
        return {**({"images": images} if self.held else {}),
                **({"frames": self.frames} if self.frames else {}),
                **({"looped": True} if GRID in self.fixed else {}),
                **({"tiles": self.tiles, "tile": self.tile or self.pixels.shape[-1]}
                   if self.tiles else {}),
                **({"cross": True} if self.cross else {})}


def any_resolution(model: Any, images: int, side: int | None) -> Images:
    """LLaVA-NeXT's images (LLaVA-OneVision's): an image of `side` (default the vision
    config's) as the grid of tiles of the vision config's side its processor cuts it into
    beside the whole image resized, as many as transformers counts (`image_size_to_num_patches`
    of its grid pinpoints), its `image_sizes` held in the graph."""
    import torch

    vision, code = model.config.vision_config, sys.modules[type(model).__module__]
    s = vision.image_size
    side = side or s
    n = code.image_size_to_num_patches(image_size=(side, side), patch_size=s,
                                       grid_pinpoints=model.config.image_grid_pinpoints)
    return Images(torch.zeros(images, n, vision.num_channels, s, s),
                  {"image_sizes": torch.tensor([[side, side]] * images)}, [side, side], True, n)


def processed(model: Any, images: int, side: int | None) -> Images:
    """LFM2-VL's images: what transformers' image processor of its kind (at its defaults)
    makes of an image of `side` a side (default its tile's): lists of patches padded to its
    most, a tile's or the image's own, beside the whole where it tiles, their sizes and masks
    held in the graph."""
    import numpy as np
    import torch
    from transformers.models.auto import image_processing_auto as auto

    names = auto.IMAGE_PROCESSOR_MAPPING_NAMES[model.config.model_type]
    processor = auto.get_image_processor_class_from_name(
        names.get("torchvision") or next(iter(names.values())))()
    side = side or processor.tile_size
    out = processor(images=[np.zeros((side, side, 3), np.uint8)], return_tensors="pt")
    n = out["pixel_values"].shape[0]  # [N, patches, 3 p p]: tiles and the whole, or the image
    return Images(torch.zeros(images, *out["pixel_values"].shape),
                  {k: out[k].repeat(images, 1) for k in (LISTS, "pixel_attention_mask")},
                  [side, side], True, tiles=n if n > 1 else 0, tile=processor.tile_size)


def features_code(inner: Any) -> str:
    """The source of `inner`'s get_image_features; "" where it has none to read (Llama 3.2
    Vision's)."""
    try:
        return inspect.getsource(type(inner).get_image_features)
    except (OSError, TypeError, AttributeError):
        return ""


def splits(inner: Any) -> bool:
    """Whether `inner` (a vision-language model's inner model) takes an image as tiles of its
    vision config's side beside the whole resized, padding a batch's images by all-zero tiles
    its get_image_features drops by their values (Idefics3's, SmolVLM's)."""
    return "real_images_inds" in features_code(inner) and hasattr(
        getattr(inner, "connector", None), "pixel_shuffle")


def split_image(model: Any, images: int, where: str, kind: str,
                side: int | None) -> Images:
    """Idefics3's and SmolVLM's images: its processor resizes an image to `side` (its
    `size.longest_edge`; default 4 tiles a side, as its processors'), then up to a whole number
    of tiles of the vision config's side, cuts it into them and, where there are several, adds
    the whole resized to one."""
    import torch

    vision, shuffle = model.config.vision_config, model.config.scale_factor
    s = vision.image_size
    if (s // vision.patch_size) % shuffle:
        raise ConversionError(f"{where}: model_type {kind!r}: a tile of {s} pixels is "
                              f"{s // vision.patch_size} patches of {vision.patch_size} a side, "
                              f"which its connector cannot shuffle {shuffle} x {shuffle}: give "
                              "vision_config.image_size and patch_size of its checkpoint")
    k = -(-(side or 4 * s) // s)  # tiles a side
    side, n = k * s, k * k + 1 if k > 1 else 1
    return Images(torch.zeros(images, n, vision.num_channels, s, s), {}, [side, side], True,
                  tiles=n if k > 1 else 0)


def every_tile(self: Any, pixel_values: Any, pixel_attention_mask: Any = None,
                **kwargs: Any) -> Any:
    """Idefics3's get_image_features without its search of the tiles' values for padding:
    one image a sample at one size pads none. Its encoder's and connector's work on every tile
    [B N, C, s, s], the features [B N, tokens, d]."""
    import torch

    x = pixel_values.to(self.dtype).flatten(0, 1)
    g = x.shape[-1] // self.config.vision_config.patch_size
    mask = torch.ones(*map(int, (x.shape[0], g, g)), dtype=torch.bool)  # every patch: values
    # on the CPU (its encoder reads them), the graph at the example's batch (`Images.held`)
    out = self.vision_model(pixel_values=x, patch_attention_mask=mask,
                            **{**kwargs, "return_dict": True})
    out.pooler_output = self.connector(out.last_hidden_state)
    return out


def cross_tiles(model: Any, where: str, kind: str, side: int | None) -> Images:
    """A cross-attention model's image: its processor cuts it into tiles of the vision
    config's side and pads it to `max_num_tiles` of them, which the encoder runs all of."""
    import torch

    vision = model.config.vision_config
    s, tiles = vision.image_size, vision.max_num_tiles
    if side and side != s:
        raise ConversionError(f"{where}: image_size {side}: model_type {kind!r} encodes "
                              f"tiles of {s} x {s}, an image padded to {tiles} of them: give "
                              f"{s}")
    return Images(torch.zeros(1, 1, tiles, vision.num_channels, s, s), {}, [s, s], tiles=tiles,
                  cross=True)


def unpadded(features: Any, size: Any) -> Any:
    """`features` [C, H, W] of an image of `size` (H, W) resized into them, its padding cut:
    the rows (or columns) beyond its own aspect ratio, half each side."""
    h0, w0 = (int(v) for v in (size.tolist() if hasattr(size, "tolist") else size))
    h, w = (int(d) for d in features.shape[1:])
    if w0 * h > h0 * w:  # wider than the canvas: rows of padding above and below
        cut = (h - int(round(h0 * w / w0, 7))) // 2
        return features[:, cut:h - cut, :]
    cut = (w - int(round(w0 * h / h0, 7))) // 2
    return features[:, :, cut:w - cut]
